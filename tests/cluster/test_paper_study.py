"""The checkpoint study (quick variant) on the real 2-node Slurm cluster: a SIGKILL drill recovers
and completes for each framework, and the report carries all five dimensions for all three (the
size and scale runs of PyTorch only in CI, of every framework with FAULTDRILL_FULL=1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from campaigns import full_campaigns

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = {"torch", "tensorflow", "chainer"}
STUDY_TIMEOUT_S = 1500


def test_quick_study_covers_every_dimension_for_every_framework(shared_tmp: Path, slurm) -> None:
    spec = yaml.safe_load((REPO / "experiments" / "campaigns" / "paper-study-quick.yaml").read_text())
    spec["workdir"] = str(shared_tmp / "work")
    # CI: the size and scale dimensions (a 1M-parameter and a 4-rank run per framework, each a job of
    # its own whose cost is the framework's start-up) for PyTorch; every framework with FAULTDRILL_FULL=1.
    scaled = FRAMEWORKS if full_campaigns() else {"torch"}
    for grid in spec["sweep"]["grid"][1:]:
        grid["workload.framework"] = sorted(scaled)
    spec_path = shared_tmp / "study.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec_path), "--format", "json"],
                          capture_output=True, text=True, timeout=STUDY_TIMEOUT_S)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    for run in report.get("runs", []):
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"])
    assert done.returncode == 0, done.stderr[-4000:]

    faulted = [run for run in report["runs"] if run["faults"]]
    assert {run["framework"] for run in faulted} == FRAMEWORKS
    for run in faulted:
        assert run["status"] == "completed", run["run_id"]
        assert run["final_step"] == run["target_steps"]
        assert any(rec["resumed_from_step"] > 0 for rec in run["recoveries"]), run["run_id"]
        assert run["identical_to_baseline"] is not None and run["max_abs_weight_diff"] is not None

    study = report["study"]
    assert {row["framework"] for row in study["determinism"]} == FRAMEWORKS
    assert {row["framework"] for row in study["recovery"]} == FRAMEWORKS
    for dimension in ("cost", "format_size", "scale"):
        assert {row["framework"] for row in study[dimension]} == FRAMEWORKS, dimension
    assert all(row["bytes"] > 0 and row["overhead_vs_raw"] > 0 for row in study["format_size"])
    assert all(row["blocking_share_of_step"] is not None for row in study["cost"])
    for framework in FRAMEWORKS:
        ranks = {row["ranks"] for row in study["scale"] if row["framework"] == framework}
        assert ({2, 4} if framework in scaled else {2}) <= ranks, (framework, ranks)
    shown = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(shared_tmp / "work")],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-4000:]
    table = shown.stdout
    assert "Checkpoint study - deterministic resume" in table and "chainer" in table and "tensorflow" in table
