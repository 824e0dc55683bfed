"""experiments/campaigns/fault-catalogue.yaml on the real 2-node Slurm cluster (issue 8): each kind
acted on its intended target through the agent in the job's allocation (or from the controller for a
checkpoint), each run recovered (the stall: went on without a restart) and ended bit for bit as its
fault-free twin, and the recoveries carry the fault's kind."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from experiments.layout import RunPaths, read_json_lines

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHARED_TMP_ROOT = Path("/var/tmp/faultdrill-tests")  # outside /tmp: the nodes have a private one
DRILL_TIMEOUT_S = 900
PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")


@pytest.fixture(scope="module")
def report(_cluster_up: tuple[bool, str]) -> Iterator[dict[str, Any]]:
    """One drill of the whole campaign (its runs share the cluster two at a time), for every test."""
    if not _cluster_up[0]:
        pytest.skip("cluster not up")  # _require_cluster fails the tests themselves when it must be up
    shared = SHARED_TMP_ROOT / f"fault-catalogue-{uuid.uuid4().hex[:8]}"
    shared.mkdir(parents=True)
    spec = yaml.safe_load((REPO / "experiments" / "campaigns" / "fault-catalogue.yaml").read_text())
    spec["workdir"] = str(shared / "work")
    path = shared / "fault-catalogue.yaml"
    path.write_text(yaml.safe_dump(spec))
    try:
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(path), "--format", "json"],
                              capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-4000:]
        yield {**json.loads(done.stdout), "workdir": str(shared / "work")}
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _run(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    run = next(run for run in report["runs"] if run["run_id"] == run_id)
    assert run["status"] == "completed" and run["final_step"] == 3000
    assert run["identical_to_baseline"] is True
    assert all(rec[phase] >= 0 for rec in run["recoveries"] for phase in PHASES)
    return run


def test_kill_rank_hits_every_rank_on_both_nodes_at_one_instant(report: dict[str, Any], cluster) -> None:
    run = _run(report, "r000")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected"
    assert {node for node in re.findall(r"@([\w-]+)", fault["target"])} == set(cluster)
    spread = float(re.search(r"acted within ([\d.]+) s", fault["detail"]).group(1))
    assert spread < 0.5, f"the two nodes' kills were {spread} s apart"
    assert [rec["fault_kind"] for rec in run["recoveries"]] == ["kill-rank"]


def test_hang_rank_is_found_by_its_silence(report: dict[str, Any]) -> None:
    run = _run(report, "r001")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["signal"] == "SIGSTOP"
    assert run["attempts"][0]["reason"].startswith("hang: no heartbeat from rank")
    assert run["attempts"][0]["state"] in ("CANCELLED", "FAILED")
    [recovery] = run["recoveries"]
    assert recovery["fault_kind"] == "hang-rank" and recovery["detect_s"] >= 5


def test_a_stall_costs_no_restart(report: dict[str, Any]) -> None:
    run = _run(report, "r002")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["detail"].startswith("went on: stopped for 2.0")
    assert len(run["attempts"]) == 1 and run["recoveries"] == []


def test_a_corrupted_checkpoint_is_skipped_and_kept_aside(report: dict[str, Any]) -> None:
    run = _run(report, "r003")
    corrupt, kill = run["faults"]
    assert corrupt["outcome"] == "injected" and corrupt["target"].startswith("checkpoint step-00002000/")
    assert kill["outcome"] == "injected"
    [recovery] = run["recoveries"]
    assert recovery["fault_kind"] == "kill-rank" and recovery["resumed_from_step"] == 1000
    paths = RunPaths(Path(report["workdir"]) / "runs" / "r003")
    assert [entry["from"].rsplit("/", 1)[-1] for entry in read_json_lines(paths.quarantine / "index.jsonl")] == [
        "step-00002000"]
