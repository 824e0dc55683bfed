"""A failed attempt in the ledger: when it was detected and why, its class with the facts it was
taken from, and the class taken again once its job's end (or a fault's late record) tells more."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from orchestrator.campaign.failure_classes import Classified, DrillEnded, FailureEvidence, classify
from orchestrator.observe.failure_signs import facts_from_json, facts_json
from orchestrator.observe.watch import FailureSign
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.states import JobState
from orchestrator.strategies.base import Continuation

STEP_FAILED = "STEP_FAILED"  # in-allocation: the attempt's rank step failed, its job went on


def record_failure(ledger: Ledger, run_id: str, attempt: int, sign: FailureSign, continuation: Continuation,
                   evidence: FailureEvidence, classified: Classified, failed_nodes: tuple[str, ...], now: float) -> None:
    """Write the failure of ``attempt`` as the strategy goes on after it (``continuation``)."""
    if continuation.in_same_job:  # the job goes on as the next attempt: this one's state is its own
        ledger.update_attempt(run_id, attempt, state=JobState.REQUEUED.value
                              if continuation is Continuation.REQUEUE else STEP_FAILED)
    # warm: the coordinator's moment, not this controller's next look
    detected = sign.at if continuation is Continuation.FOLLOW_WARM else now
    ledger.update_attempt(run_id, attempt, ended=now, detected=detected, reason=sign.reason, failed_at=sign.at,
                          failure_evidence=sign.evidence, failure_class=classified.failure_class.value,
                          class_evidence=classified.evidence, class_facts=facts_json(evidence),
                          failed_nodes=",".join(failed_nodes) or None)


def reclassify_at_end(ledger: Ledger, row: AttemptRow, state: JobState, oom_killed: tuple[str, ...],
                      ended_by_drill: DrillEnded | None, oom_steps: Callable[[], tuple[str, ...]]) -> None:
    """A failed attempt's job ended: its class taken again with the scheduler's final word, if the
    class was taken before (TIMEOUT, NODE_FAIL may tell more than a rank's exit; ``oom_steps``, asked
    here only, the job's steps that ran out of memory), and with the injector's record if it came
    after (an agent's OOM-kill count)."""
    if row.class_facts is None or not state.is_terminal:
        return
    evidence = facts_from_json(row.class_facts)
    _take_again(ledger, row, evidence, replace(
        evidence, state=evidence.state if evidence.state.is_terminal else state,
        oom_killed=evidence.oom_killed or oom_killed, ended_by_drill=evidence.ended_by_drill or ended_by_drill,
        oom_steps=evidence.oom_steps or (() if state.is_success else oom_steps())))


def reclassify_with_record(ledger: Ledger, row: AttemptRow, oom_killed: tuple[str, ...],
                           signalled: str | None = None) -> None:
    """A fault agent's record came after its attempt's failure was classified (the agent answers once
    it has read the rank's end; the controller often sees the end first): the class taken again
    with it now. A warm or in-allocation attempt's job goes on, so its end would come too late."""
    if row.class_facts is None:
        return
    evidence = facts_from_json(row.class_facts)
    _take_again(ledger, row, evidence, replace(evidence, oom_killed=evidence.oom_killed or oom_killed,
                                               signalled=evidence.signalled or signalled))


def _take_again(ledger: Ledger, row: AttemptRow, evidence: FailureEvidence, refreshed: FailureEvidence) -> None:
    if refreshed == evidence:
        return
    classified = classify(refreshed)
    ledger.update_attempt(row.run_id, row.attempt, failure_class=classified.failure_class.value,
                          class_evidence=classified.evidence, class_facts=facts_json(refreshed))
    # The recovery from it may be recorded already (the next attempt started before the record came):
    # it carries the class it copied then, taken again with the attempt's.
    later = [recovery.attempt for recovery in ledger.recoveries(row.run_id) if recovery.attempt > row.attempt]
    if later:
        ledger.update_recovery(row.run_id, min(later), failure_class=classified.failure_class.value,
                               class_evidence=classified.evidence)
