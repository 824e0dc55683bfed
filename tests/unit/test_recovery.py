"""Time-to-recover phases and lost work, from recorded events and heartbeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.layout import RunPaths, append_json_line
from orchestrator.record.ledger import AttemptRow
from orchestrator.record.recovery import Failure, compute_recovery, last_progress, recovering_from


def _beat(paths: RunPaths, rank: int, attempt: int, step: int, at: float) -> None:
    append_json_line(paths.heartbeat_file(attempt, rank), {"attempt": attempt, "step": step, "time": at})


def _event(paths: RunPaths, attempt: int, name: str, at: float, **extra: object) -> None:
    append_json_line(paths.events_file(attempt), {"event": name, "time": at, **extra})


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path)
    for step in range(0, 61, 10):  # attempt 0: steps 0..60 at 1 s per 10 steps, from t=100
        for rank in (0, 1):
            _beat(paths, rank, 0, step, 100.0 + step / 10)
    _beat(paths, 0, 0, 70, 200.0)  # after the fault: must not count as progress
    _event(paths, 1, "job_start", 110.0)
    _event(paths, 1, "process_start", 110.2)
    _event(paths, 1, "framework_ready", 112.0)
    _event(paths, 1, "checkpoint_loaded", 112.5, step=40, load_s=0.5)
    _event(paths, 1, "first_step", 112.75, step=41)
    return paths


def test_phases_add_up_to_ttr(paths: RunPaths) -> None:
    failure = Failure(kind="kill-rank", at=106.05, detected=106.25)
    failed = AttemptRow(run_id="r", attempt=0, job_id="1", state="FAILED", submitted=99.0, accepted=99.5)
    resumed = AttemptRow(run_id="r", attempt=1, job_id="2", state="RUNNING", submitted=106.3, accepted=106.5)
    rec = compute_recovery(paths, failure, failed, resumed, ranks=2)
    assert rec is not None
    assert rec.detect_s == pytest.approx(0.2)
    assert rec.resubmit_s == pytest.approx(0.25)
    assert rec.queue_s == pytest.approx(3.5)
    assert rec.startup_s == pytest.approx(2.0)
    assert rec.load_s == pytest.approx(0.5)
    assert rec.first_step_s == pytest.approx(0.25)
    assert rec.ttr_s == pytest.approx(112.75 - 106.05)  # the fault to the first step after it
    assert rec.clock_correction_s == 0
    assert rec.resumed_from_step == 40
    assert rec.lost_steps == 60 - 40
    assert rec.lost_s == pytest.approx(106.0 - 104.0)
    assert rec.lost_rank_s == pytest.approx(2 * 2.0)


def test_recovery_waits_for_the_first_step(paths: RunPaths, tmp_path: Path) -> None:
    empty = RunPaths(tmp_path / "other")
    failure = Failure(kind="kill-rank", at=106.0, detected=106.2)
    rows = (AttemptRow("r", 0, "1", "FAILED", 99.0), AttemptRow("r", 1, "2", "RUNNING", 106.3, accepted=106.5))
    assert compute_recovery(empty, failure, *rows, ranks=2) is None


def test_last_progress_ignores_beats_after_the_fault(paths: RunPaths) -> None:
    assert last_progress(paths, 2, 0, before=106.05) == (60, 106.0)
    assert last_progress(paths, 2, 0, before=300.0)[0] == 70


def test_a_node_clock_behind_the_controllers_never_gives_a_negative_phase(paths: RunPaths) -> None:
    """The new job's node reads 4 s behind the login node: its job start (110.0) comes before the
    acceptance the controller saw (112.0). The phase is 0, not -2, and the move is reported."""
    failure = Failure(kind="kill-rank", at=106.05, detected=106.25, evidence="fault")
    failed = AttemptRow(run_id="r", attempt=0, job_id="1", state="FAILED", submitted=99.0, accepted=99.5)
    resumed = AttemptRow(run_id="r", attempt=1, job_id="2", state="RUNNING", submitted=111.8, accepted=112.0)
    rec = compute_recovery(paths, failure, failed, resumed, ranks=2)
    assert rec is not None
    assert rec.queue_s == 0 and rec.startup_s == pytest.approx(0.0)  # framework_ready 112.0 <= accepted
    assert rec.clock_correction_s == pytest.approx(2.0) and rec.failure_evidence == "fault"


def test_a_restart_that_failed_before_its_first_step_is_part_of_the_recovery(paths: RunPaths) -> None:
    """Attempt 1 trained (its first step at 112.75) and failed; attempt 2 failed in its start-up
    (no first step); attempt 3 recovers: its recovery counts from attempt 1's failure, spanning 2."""
    _event(paths, 2, "job_start", 120.0)
    _event(paths, 2, "process_start", 120.1)
    assert recovering_from(paths, [0, 1, 2]) == 1
    assert recovering_from(paths, [0, 1]) == 1
    assert recovering_from(paths, [0]) == 0, "a first attempt that never stepped is still the failure"
    for name, at in (("job_start", 130.0), ("framework_ready", 131.0)):
        _event(paths, 3, name, at)
    _event(paths, 3, "checkpoint_loaded", 131.5, step=40, load_s=0.5)
    _event(paths, 3, "first_step", 131.75, step=41)
    failure = Failure(kind="kill-rank", at=114.0, detected=114.2)
    failed = AttemptRow(run_id="r", attempt=1, job_id="2", state="FAILED", submitted=106.3, accepted=106.5)
    resumed = AttemptRow(run_id="r", attempt=3, job_id="4", state="RUNNING", submitted=125.0, accepted=125.5)
    rec = compute_recovery(paths, failure, failed, resumed, ranks=2, failed_restarts=1)
    assert rec is not None and rec.failed_restarts == 1 and rec.attempt == 3
    assert rec.ttr_s == pytest.approx(131.75 - 114.0) and rec.resubmit_s == pytest.approx(125.5 - 114.2)

