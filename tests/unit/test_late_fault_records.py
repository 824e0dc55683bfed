"""An oom-rank's record (the kernel's OOM-kill count) comes after the controller saw the rank's end:
a warm job does not end after a failure, so the record itself takes the attempt's class again
(RANK_SIGNAL -> OUT_OF_MEMORY), once the fault is settled as its cause. Review of issue 21's fix:
an absorbed oom-rank flipped the class too, and a controller that died between the record and the
reclassification left the class unchanged for good."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

from injectors.kinds.base import FaultOutcome
from injectors.schedule import PlannedFault
from orchestrator.campaign.failure_classes import FailureEvidence, classify
from orchestrator.control.failed_attempt import reclassify_at_end, reclassify_with_record, record_failure
from orchestrator.faults.book import SENDING, FaultBook, InFlight, _row
from orchestrator.observe.watch import FailureSign
from orchestrator.record.ledger import Ledger
from orchestrator.states import JobState
from orchestrator.strategies.base import Continuation

pytestmark = pytest.mark.unit

RUN = "r000"


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as executor:
        yield executor


def _failed_warm_attempt(workdir: Path, failed_at: float) -> tuple[Ledger, FailureSign]:
    ledger = Ledger.in_workdir(workdir)
    ledger.add_attempt(RUN, 0)
    ledger.update_attempt(RUN, 0, job_id="42", state="RUNNING")
    sign = FailureSign(reason="warm: rank 1 lost", at=failed_at, evidence="warm")
    evidence = FailureEvidence(state=JobState.RUNNING, noticed_by="warm", exit_code=137)
    record_failure(ledger, RUN, 0, sign, Continuation.FOLLOW_WARM, evidence, classify(evidence), (), time.time())
    return ledger, sign


def _book(ledger: Ledger, pool: ThreadPoolExecutor, on_record=None) -> FaultBook:
    book = FaultBook(RUN, [], ledger, pool, act=None, on_record=on_record)  # type: ignore[arg-type]  # never acts
    return book


def _late_record(ledger: Ledger, book: FaultBook) -> Callable[[int], None]:
    def late(attempt: int) -> None:  # as RunTracker._late_record
        row = next(row for row in ledger.attempts(RUN) if row.attempt == attempt)
        reclassify_with_record(ledger, row, book.oom_killed(attempt))
    return late


def _answered_oom(book: FaultBook, ledger: Ledger, asked_at: float) -> None:
    fault = PlannedFault(index=0, kind="oom-rank", delay_s=1.0, anchor="training_start", ranks=(1,), target="rank 1")
    fault_id = ledger.add_fault(_row(RUN, 0, fault, SENDING))
    answer: Future[FaultOutcome] = Future()
    answer.set_result(FaultOutcome(kind="oom-rank", target="rank 1@n1", at=asked_at, node="n1", pid=99,
                                   signal="SIGKILL", detail="the kernel's OOM killer ended it"))
    book.next_index = 1
    book.in_flight = InFlight(fault_id, 0, answer, fault)


def _class(ledger: Ledger) -> str | None:
    return ledger.attempts(RUN)[0].failure_class


def test_the_record_of_the_oom_kill_that_caused_the_failure_takes_its_class_again(tmp_path: Path, pool) -> None:
    ledger, sign = _failed_warm_attempt(tmp_path, time.time())
    book = _book(ledger, pool)
    book.on_record = _late_record(ledger, book)
    assert _class(ledger) == "RANK_SIGNAL"
    _answered_oom(book, ledger, asked_at=sign.at - 1.0)
    book.attempt_ended(0, sign, completed=False)
    book.collect()
    assert _class(ledger) == "OUT_OF_MEMORY"


def test_an_oom_rank_that_came_after_the_failure_is_absorbed_and_changes_no_class(tmp_path: Path, pool) -> None:
    ledger, sign = _failed_warm_attempt(tmp_path, time.time() - 5)
    book = _book(ledger, pool)
    book.on_record = _late_record(ledger, book)
    _answered_oom(book, ledger, asked_at=sign.at + 2.0)  # asked 2 s after the attempt was already failing
    book.attempt_ended(0, sign, completed=False)
    book.collect()
    assert ledger.faults(RUN)[0].outcome == "absorbed"
    assert _class(ledger) == "RANK_SIGNAL"


def test_a_controller_that_died_before_the_reclassification_leaves_it_to_the_next(tmp_path: Path, pool) -> None:
    ledger, sign = _failed_warm_attempt(tmp_path, time.time())

    def killed(attempt: int) -> None:
        raise KeyboardInterrupt("the controller is killed here")

    book = _book(ledger, pool, on_record=killed)
    _answered_oom(book, ledger, asked_at=sign.at - 1.0)
    book.attempt_ended(0, sign, completed=False)
    with pytest.raises(KeyboardInterrupt):
        book.collect()
    assert _class(ledger) == "RANK_SIGNAL"
    restarted = _book(ledger, pool)
    late = _late_record(ledger, restarted)
    for attempt in restarted.caused_oom_attempts():  # as RunTracker does when it starts
        late(attempt)
    assert _class(ledger) == "OUT_OF_MEMORY"


def _launch_exited(workdir: Path, exit_code: int) -> Ledger:
    """Attempt 0 of job 42 failed as its rank launch exited with ``exit_code``, classified then."""
    ledger = Ledger.in_workdir(workdir)
    ledger.add_attempt(RUN, 0)
    ledger.update_attempt(RUN, 0, job_id="42", state="RUNNING")
    sign = FailureSign(reason=f"rank launch exited with code {exit_code}", at=time.time(), evidence="step_exit")
    evidence = FailureEvidence(state=JobState.RUNNING, noticed_by="step_exit", exit_code=exit_code)
    record_failure(ledger, RUN, 0, sign, Continuation.NEW_JOB, evidence, classify(evidence), (), time.time())
    return ledger


def test_a_step_the_scheduler_says_ran_out_of_memory_makes_the_attempt_out_of_memory_at_its_jobs_end(
        tmp_path: Path) -> None:
    """Issue 22 item 4: Slurm's task/cgroup ends a rank that outgrew the job's --mem; the rank step
    is OUT_OF_MEMORY while the job is FAILED (its batch script went on). A failure taken from the
    launch's exit (RANK_SIGNAL) is taken again at the job's end with the steps the scheduler names,
    asked then only, and not for a job that ended well."""
    ledger = _launch_exited(tmp_path, 137)
    assert _class(ledger) == "RANK_SIGNAL"
    asked: list[str] = []

    def steps() -> tuple[str, ...]:
        asked.append("sacct")
        return ("42.0",)

    reclassify_at_end(ledger, ledger.attempts(RUN)[0], JobState.FAILED, (), None, steps)
    row = ledger.attempts(RUN)[0]
    assert row.failure_class == "OUT_OF_MEMORY" and row.class_evidence == "the scheduler: step 42.0 OUT_OF_MEMORY"
    reclassify_at_end(ledger, row, JobState.FAILED, (), None, steps)
    assert asked == ["sacct"], "the steps are kept with the facts: asked once"


def test_a_kill_whose_record_came_after_a_survivors_exit_takes_the_class_again(tmp_path: Path) -> None:
    """CI on the session's changes (the venv's Open MPI 5 under srun): the kill's step was not seen
    yet when the launch's exit (a survivor's, code 1: Open MPI 5 aborts its world) was classified,
    so no signal was known: RANK_EXIT. The agent's record of the SIGKILL takes the class again."""
    ledger = _launch_exited(tmp_path, 1)
    assert _class(ledger) == "RANK_EXIT"
    reclassify_with_record(ledger, ledger.attempts(RUN)[0], (), "SIGKILL")
    assert _class(ledger) == "RANK_SIGNAL" and "SIGKILL" in (ledger.attempts(RUN)[0].class_evidence or "")


def test_a_recovery_recorded_before_the_kills_record_takes_the_class_again_with_its_attempt(tmp_path: Path) -> None:
    """CI (the venv's Open MPI 5 under srun, twice in five runs): the next attempt started, and its
    recovery was recorded with the class it copied (RANK_EXIT), before the agent's record of the
    SIGKILL came; the attempt's class was taken again, the recovery's was not."""
    from orchestrator.record.ledger import RecoveryRow

    ledger = _launch_exited(tmp_path, 1)
    row = ledger.attempts(RUN)[0]
    ledger.add_attempt(RUN, 1)
    ledger.add_recovery(RecoveryRow(run_id=RUN, attempt=1, fault_kind="kill-rank", fault_at=100.0, detect_s=0.2,
                                    resubmit_s=0.1, queue_s=0.1, startup_s=3.0, load_s=0.1, first_step_s=0.05,
                                    ttr_s=3.55, lost_steps=10, lost_s=0.1, lost_rank_s=0.2, resumed_from_step=100,
                                    failure_class=row.failure_class or "", class_evidence=row.class_evidence or ""))
    reclassify_with_record(ledger, row, (), "SIGKILL")
    [recovery] = ledger.recoveries(RUN)
    assert recovery.failure_class == "RANK_SIGNAL" and "SIGKILL" in recovery.class_evidence, recovery
