"""experiments/campaigns/failure-classes.yaml on the real Slurm cluster (issue 9): classes the
fault catalogue's campaign does not produce, each produced for real. The drill runs detached (as a
user on a login node starts it), the test plays the person who scancels one run's job, and reads the
report once the controller has ended:

- hang-rank during start-up (anchor ranks_started): no first step within start_timeout_s: START_TIMEOUT;
- a person's scancel: CANCELLED, and the default policy gives up (no new job is submitted);
- oom-rank: the rank's memory capped by a cgroup, the kernel's OOM killer ends it: OUT_OF_MEMORY;
- rank-error: a rank raises in its training loop: RANK_EXIT.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from campaigns import campaign_copy
from conftest import wait_until
from faultdrill_cli import faultdrill, report, status
from orchestrator.control.detach import live_controller

SHARED_TMP_ROOT = Path("/var/tmp/faultdrill-tests")  # outside /tmp: the nodes have a private one
DRILL_DEADLINE_S = 900
CANCELLED_RUN = "r001"
STEPS, EVERY, START_TIMEOUT_S = 150, 50, 30  # the campaign's


def _stepping_job(workdir: Path, run_id: str) -> str | None:
    """The job of ``run_id`` once the status shows it RUNNING and training."""
    for row in status(workdir)["runs"]:
        if row["run"] == run_id and row["state"] == "RUNNING" and row["step"] > 0:
            return str(row["job"])
    return None


@pytest.fixture(scope="module")
def drilled(_cluster_up: tuple[bool, str]) -> Iterator[tuple[dict[str, Any], str]]:
    """The campaign's report, and the job the person cancelled."""
    if not _cluster_up[0]:
        pytest.skip("cluster not up")  # _require_cluster fails the tests themselves when it must be up
    shared = SHARED_TMP_ROOT / f"failure-classes-{uuid.uuid4().hex[:8]}"
    shared.mkdir(parents=True)
    workdir = shared / "work"
    spec = campaign_copy("failure-classes", shared)
    faultdrill("drill", str(spec), "--detach")
    try:
        job = wait_until(lambda: _stepping_job(workdir, CANCELLED_RUN), 300, message=f"{CANCELLED_RUN} to train")
        subprocess.run(["scancel", job], check=True, timeout=60)  # a person, outside the drill
        wait_until(lambda: live_controller(workdir) is None, DRILL_DEADLINE_S, interval=1.0,
                   message="the detached controller to end")
        drilled = report(workdir)
        if keep := os.environ.get("FAULTDRILL_KEEP_REPORT"):
            Path(keep).write_text(json.dumps(drilled, indent=1))
        yield drilled, job
    finally:
        if live_controller(workdir) is not None:
            faultdrill("cancel", str(workdir), timeout=300)
        shutil.rmtree(shared, ignore_errors=True)


def _run(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    return next(run for run in report["runs"] if run["run_id"] == run_id)


def _recovered(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The run completed bit for bit as its twin after exactly one recovery, which it returns."""
    run = _run(report, run_id)
    assert run["status"] == "completed" and run["final_step"] == STEPS, run["attempts"]
    assert run["identical_to_baseline"] is True
    assert len(run["recoveries"]) == 1, (run["attempts"], run["recoveries"])
    return run["recoveries"][0]


def test_a_rank_stuck_in_its_start_up_is_a_start_timeout(drilled: tuple[dict[str, Any], str]) -> None:
    run = _run(drilled[0], "r000")
    recovery = _recovered(drilled[0], "r000")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["signal"] == "SIGSTOP", fault
    assert run["attempts"][0]["reason"].startswith(f"no training step within {START_TIMEOUT_S} s"), run["attempts"][0]
    assert recovery["failure_class"] == "START_TIMEOUT" and recovery["resumed_from_step"] == 0, recovery
    stuck = run["attempts"][0]
    assert stuck["ended"] - stuck["started"] >= START_TIMEOUT_S - 1, "a start-up is stuck only after start_timeout_s"


def test_a_persons_scancel_is_cancelled_and_the_run_gives_up(drilled: tuple[dict[str, Any], str], slurm) -> None:
    report, job = drilled
    run = _run(report, CANCELLED_RUN)
    assert run["status"] == "gave_up", run
    [attempt] = run["attempts"]  # nothing was submitted after the cancel
    assert attempt["job_id"] == job and attempt["failure_class"] == "CANCELLED", attempt
    assert slurm.wait_sacct_state(job, timeout=60)["State"].startswith("CANCELLED")


def test_a_rank_the_oom_killer_ends_is_out_of_memory_and_recovers(drilled: tuple[dict[str, Any], str]) -> None:
    run = _run(drilled[0], "r002")
    recovery = _recovered(drilled[0], "r002")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["target"].startswith("rank 1@"), fault
    assert "the kernel's OOM killer ended it" in fault["detail"] and "oom_kill 1" in fault["detail"], fault
    assert run["attempts"][0]["failure_class"] == "OUT_OF_MEMORY", run["attempts"][0]
    assert "OOM killer" in run["attempts"][0]["class_evidence"]
    assert recovery["fault_kind"] == "oom-rank" and recovery["failure_class"] == "OUT_OF_MEMORY", recovery
    assert recovery["resumed_from_step"] == EVERY, recovery
    # The agent removed the memory cgroup it made.
    assert not list(Path("/sys/fs/cgroup/memory").rglob("faultdrill-oom-*"))


def test_a_rank_that_raises_is_a_rank_exit_and_recovers(drilled: tuple[dict[str, Any], str]) -> None:
    run = _run(drilled[0], "r003")
    recovery = _recovered(drilled[0], "r003")
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["target"].startswith("rank 0@"), fault
    failed = run["attempts"][0]
    assert failed["failure_class"] == "RANK_EXIT" and "InjectedRankError" in failed["class_evidence"], failed
    assert "InjectedRankError" in failed["reason"], "the attempt's reason is the cause, not a survivor's word"
    assert recovery["fault_kind"] == "rank-error" and recovery["failure_class"] == "RANK_EXIT", recovery
    assert recovery["resumed_from_step"] == EVERY, recovery
