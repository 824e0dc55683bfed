"""The quick drill on the real Slurm cluster: ranks on both of the job's 2 nodes, a rank SIGKILLed through
a step inside the job's allocation, resubmission from the newest valid checkpoint, and a final
state identical to the fault-free twin. Accounting (sacct) shows every attempt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from experiments.layout import RunPaths, attempt_event_lines
from faultdrill_cli import FULL_ONLY

REPO = Path(__file__).resolve().parents[2]
DRILL_TIMEOUT_S = 600


def _slurm_quick_spec(workdir: Path, destination: Path) -> Path:
    spec = yaml.safe_load((REPO / "experiments" / "campaigns" / "slurm-quick.yaml").read_text())
    spec["workdir"] = str(workdir)
    destination.write_text(yaml.safe_dump(spec))
    return destination


def _run(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    return next(run for run in report["runs"] if run["run_id"] == run_id)


@FULL_ONLY  # CI: its checks on the resubmit run of tests/cluster/test_strategies.py (1 rank a node)
def test_slurm_quick_drill_recovers_on_two_nodes(shared_tmp: Path, cluster, slurm) -> None:
    spec = _slurm_quick_spec(shared_tmp / "work", shared_tmp / "slurm-quick.yaml")
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["backend"] == "slurm"
    faulted = _run(report, "r000")
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"])

    assert faulted["status"] == "completed"
    assert faulted["final_step"] == faulted["target_steps"]
    assert faulted["ranks"] == 4 and faulted["nodes"] == 2
    assert any(fault["at"] for fault in faulted["faults"])
    assert any(rec["resumed_from_step"] > 0 for rec in faulted["recoveries"])
    assert faulted["identical_to_baseline"] is True

    paths = RunPaths(shared_tmp / "work" / "runs" / "r000")
    nodes = {json.loads(paths.rank_file(0, rank).read_text())["node"] for rank in range(4)}
    assert len(nodes) == 2 and nodes <= set(cluster), f"ranks ran on {nodes}, expected 2 nodes of {set(cluster)}"

    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.wait_sacct_state(attempt["job_id"], timeout=60, name_prefix="fd-slurm-quick-")
    failed_attempt = faulted["attempts"][0]
    assert slurm.wait_sacct_state(failed_attempt["job_id"])["State"].split()[0] in {"FAILED", "CANCELLED"}
    assert attempt_event_lines(paths, 0)[0]["event"] == "job_start"
