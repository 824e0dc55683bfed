"""What a fault is recorded as once its attempt has ended (orchestrator/faults/book.py): a fault that
ends its attempt (kill, hang, rank-error, oom, preempt) but met an attempt that trained to the end
all the same came too late, or took no effect: `absorbed`, not `injected` with "no failure" (the
soak of issue 21 found a rank-error raised as the run finished, recorded injected, no recovery). A
fault the attempt survives by design (stall, corrupt-checkpoint) stays injected: it went on."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.faults.book import ABSORBED, ACTED, INJECTED, FaultBook
from orchestrator.record.ledger import FaultRow, Ledger

pytestmark = pytest.mark.unit


def _settled(tmp_path: Path, kind: str) -> FaultRow:
    ledger = Ledger.in_workdir(tmp_path)
    try:
        ledger.add_fault(FaultRow(fault_id=None, run_id="r000", attempt=0, plan_index=0, kind=kind, target="rank 1",
                                  signal="", planned_delay_s=1.0, at=time.time(), pid=42, node="n1",
                                  outcome=INJECTED, detail=f"{ACTED}raised in the training loop"))
        with ThreadPoolExecutor(max_workers=1) as pool:
            book = FaultBook("r000", [], ledger, pool, act=lambda *args: None)  # type: ignore[arg-type,return-value]  # never acts here
            book.attempt_ended(0, None, completed=True)
            book.collect()
        [row] = ledger.faults("r000")
        return row
    finally:
        ledger.close()


@pytest.mark.parametrize("kind", ["kill-rank", "rank-error", "hang-rank", "oom-rank", "preempt"])
def test_a_fault_that_ends_its_attempt_but_met_one_that_completed_is_absorbed(tmp_path: Path, kind: str) -> None:
    row = _settled(tmp_path, kind)
    assert row.outcome == ABSORBED and row.detail is not None and row.detail.startswith("came too late"), row


@pytest.mark.parametrize("kind", ["stall-rank", "corrupt-checkpoint"])
def test_a_fault_its_attempt_survives_by_design_stays_injected(tmp_path: Path, kind: str) -> None:
    row = _settled(tmp_path, kind)
    assert row.outcome == INJECTED and row.detail is not None and row.detail.startswith("no failure"), row
