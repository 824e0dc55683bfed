"""What a fault is recorded as once its attempt has ended (orchestrator/faults/book.py): a fault that
ends its attempt (kill, hang, rank-error, oom, preempt) but met an attempt that trained to the end
all the same came too late, or took no effect: `late`, not `injected` with "no failure" (the
soak of issue 21 found a rank-error raised as the run finished, recorded injected, no recovery). A
fault the attempt survives by design (stall, corrupt-checkpoint) stays injected: it went on. One
that failed its attempt after the attempt had reached the run's last step is `late` too (issue 27,
item 5: the restart finds the run complete); every fault that acted records the step it met."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.faults.book import ACTED, INJECTED, LATE, FaultBook, RunProgress
from orchestrator.observe.watch import FailureSign
from orchestrator.record.ledger import FaultRow, Ledger

pytestmark = pytest.mark.unit


def _settled(tmp_path: Path, kind: str, sign: FailureSign | None = None, progress: RunProgress | None = None,
             planned_step: int | None = None) -> FaultRow:
    ledger = Ledger.in_workdir(tmp_path)
    try:
        ledger.add_fault(FaultRow(fault_id=None, run_id="r000", attempt=0, plan_index=0, kind=kind, target="rank 1",
                                  signal="", planned_delay_s=1.0, at=time.time(), pid=42, node="n1",
                                  outcome=INJECTED, detail=f"{ACTED}raised in the training loop",
                                  planned_step=planned_step))
        with ThreadPoolExecutor(max_workers=1) as pool:
            book = FaultBook("r000", [], ledger, pool, act=lambda *args: None,  # type: ignore[arg-type,return-value]  # never acts here
                             progress=progress)
            book.attempt_ended(0, sign, completed=sign is None)
            book.collect()
        [row] = ledger.faults("r000")
        return row
    finally:
        ledger.close()


@pytest.mark.parametrize("kind", ["kill-rank", "rank-error", "hang-rank", "oom-rank", "preempt"])
def test_a_fault_that_ends_its_attempt_but_met_one_that_completed_is_late(tmp_path: Path, kind: str) -> None:
    row = _settled(tmp_path, kind)
    assert row.outcome == LATE and row.detail is not None and row.detail.startswith("came too late"), row


@pytest.mark.parametrize("kind", ["stall-rank", "corrupt-checkpoint"])
def test_a_fault_its_attempt_survives_by_design_stays_injected(tmp_path: Path, kind: str) -> None:
    row = _settled(tmp_path, kind)
    assert row.outcome == INJECTED and row.detail is not None and row.detail.startswith("no failure"), row


def _killed() -> FailureSign:
    """The attempt's failure, well after the fault acted (made when the test runs, not at import)."""
    return FailureSign("the step ended with exit code 137", time.time() + 60, "step_exit", rank=0)


def _finished(tmp_path: Path, next_attempt_steps: int) -> FaultRow:
    """A kill that failed attempt 0 after it had reached the run's last step (400); attempt 1 then
    ran ``next_attempt_steps`` steps and the run completed."""
    ledger = Ledger.in_workdir(tmp_path)
    try:
        ledger.add_fault(FaultRow(fault_id=None, run_id="r000", attempt=0, plan_index=0, kind="kill-rank",
                                  target="rank 0", signal="SIGKILL", planned_delay_s=1.0, at=time.time(), pid=42,
                                  node="n1", outcome=INJECTED, detail=f"{ACTED}SIGKILL"))
        progress = RunProgress(lambda attempt, at: 400 if attempt == 0 else next_attempt_steps, last_step=400)
        with ThreadPoolExecutor(max_workers=1) as pool:
            book = FaultBook("r000", [], ledger, pool, act=lambda *args: None,  # type: ignore[arg-type,return-value]  # never acts here
                             progress=progress)
            book.attempt_ended(0, _killed(), completed=False)
            book.finish("completed", last_attempt=1)
        [row] = ledger.faults("r000")
        return row
    finally:
        ledger.close()


def test_a_fault_that_failed_its_attempt_after_the_last_step_is_late_when_the_next_ran_none(tmp_path: Path) -> None:
    row = _finished(tmp_path, next_attempt_steps=0)
    assert row.outcome == LATE and row.met_step == 400, row
    assert row.detail is not None and "had reached the run's last step (400)" in row.detail
    assert "attempt 1 found the run complete" in row.detail


def test_one_whose_next_attempt_trained_again_lost_steps_and_stays_injected(tmp_path: Path) -> None:
    """A kill between the last step's heartbeat and its checkpoint: the next attempt resumed from an
    earlier checkpoint and trained again (the review of issue 27 found it recorded late)."""
    row = _finished(tmp_path / "again", next_attempt_steps=400)
    assert row.outcome == INJECTED and row.detail is not None and row.detail.startswith("caused: "), row


def test_a_fault_that_caused_its_failure_records_the_step_it_met_beside_the_planned_one(tmp_path: Path) -> None:
    row = _settled(tmp_path, "kill-rank", _killed(), RunProgress(lambda attempt, at: 61, last_step=400),
                   planned_step=60)
    assert row.outcome == INJECTED and (row.planned_step, row.met_step) == (60, 61), row
    assert row.detail is not None and row.detail.startswith("caused: attempt 0 failed")
