"""The next attempt in the job that is already there — relaunched (in-allocation), requeued
(requeue) or re-formed by the job's own coordinator (warm) — recorded and fenced as the tracker
records a submission, before the scheduler (orchestrator.strategies.same_job) or the job is told."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from experiments.layout import RankJob
from experiments.runtime.fence import Fence, read_fence, write_fence
from orchestrator.backends.base import Backend, Submission
from orchestrator.campaign.failure_classes import FailureClass
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError
from orchestrator.control.cancels import DrillCancels
from orchestrator.observe.failure_signs import facts_from_json
from orchestrator.observe.watch import AttemptWatch
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.states import JobState
from orchestrator.strategies.same_job import REQUEUING, Requeuer

log = logging.getLogger(__name__)


class AttemptStarter(Protocol):
    """The tracker's two steps of every attempt: recorded and fenced, then accepted and watched."""

    def begin_attempt(self, attempt: int, job_name: str | None = None, array_index: int | None = None,
                      durable: bool = True, fence: bool = True) -> RankJob: ...

    def accept(self, attempt: int, submission: Submission, fence: bool = True) -> None: ...

    def rank_job(self, attempt: int) -> RankJob: ...


@dataclass(frozen=True)
class PendingGo:
    """in-allocation: the next attempt is recorded and watched in its job; its go (the fence naming
    it and the job, which the batch script waits for) is given at ``at``: the policy's backoff."""

    attempt: int
    job_id: str
    at: float


class SameJobAttempts:
    def __init__(self, run: RunConfig, backend: Backend, ledger: Ledger, drill_id: str, starter: AttemptStarter,
                 requeuer: Requeuer, cancels: DrillCancels, next_after: Callable[[int, float], None]) -> None:
        self.run, self.backend, self.ledger, self.drill_id = run, backend, ledger, drill_id
        self.starter, self.requeuer, self.cancels = starter, requeuer, cancels
        self.next_after = next_after  # next_after(attempt, now): the policy's answer to attempt's failure
        self.pending_go: PendingGo | None = None

    def resume(self, row: AttemptRow, now: float) -> bool:
        """An attempt an earlier controller left in flight, if it stopped around a requeue (asked
        again, after what is left of the backoff) or while its go was held (held again): True."""
        if row.job_id is not None and row.state == REQUEUING:
            self.resume_requeue(row.attempt, row.job_id, now, row.not_before,
                                state=self._job_state_at_failure(row.attempt - 1))
            return True
        if row.job_id is not None and row.not_before is not None and row.not_before > now and self._go_not_given(row):
            self.backend.adopt(row.job_id, self.run, self.starter.rank_job(row.attempt))
            self.hold_go(row.attempt, row.job_id, row.not_before)
            return True
        return False

    def _job_state_at_failure(self, attempt: int) -> JobState | None:
        """The scheduler's state of ``attempt``'s job when its failure was classed (its facts)."""
        row = next((row for row in self.ledger.attempts(self.run.run_id) if row.attempt == attempt), None)
        return facts_from_json(row.class_facts).state if row is not None and row.class_facts else None

    def _go_not_given(self, row: AttemptRow) -> bool:
        """The fence names the attempt but no job: an in-allocation attempt whose go is held."""
        fence = read_fence(self.run.paths)
        return fence is not None and fence.attempt == row.attempt and fence.job_id is None

    def watch_held_requeue(self, states: dict[str, JobState], now: float) -> None:
        """A requeue held for the policy's backoff whose job a person cancelled meanwhile: the
        request is dropped (it would bring the job back), the attempt recorded CANCELLED, and the
        policy decides (by default: give up)."""
        job_id = self.requeuer.held_job_id(now)
        if job_id is None or self.cancels.why(job_id) is not None:
            return
        dropped = self.requeuer.cancelled_while_held(states.get(job_id), now)
        if dropped is None:
            return
        why = f"job {job_id} was cancelled during the backoff before its requeue (not by the drill)"
        log.warning("%s: attempt %d: %s", self.run.run_id, dropped.attempt, why)
        self.ledger.update_attempt(self.run.run_id, dropped.attempt, state=JobState.CANCELLED.value, ended=now,
                                   detected=now, reason=why, failure_class=FailureClass.CANCELLED.value,
                                   class_evidence="the scheduler: CANCELLED while the requeue was held")
        self.next_after(dropped.attempt, now)

    def requeue(self, attempt: int, job_id: str, now: float, already: bool, not_before: float | None = None,
                state: JobState | None = None) -> None:
        """The next attempt is the same job, requeued: recorded, and named in the fence (job and
        attempt) before the scheduler is asked (after the policy's backoff, ``not_before``, recorded
        with it), so that the job's next start runs as it. A requeue the scheduler made itself
        (``already``) has no backoff left to wait."""
        held = None if already or not_before is None or not_before <= now else not_before
        # One transaction: an attempt recorded without its job would be looked up by name after a
        # crash, and the lookup finds the failed job of the attempt before (not yet requeued).
        with self.ledger.transaction():
            self._begin(attempt, job_id, fence=False)
            self.ledger.update_attempt(self.run.run_id, attempt, job_id=job_id, state=REQUEUING, not_before=held)
        write_fence(self.run.paths, Fence(attempt, job_id, self.drill_id))
        self.requeuer.requeue(attempt, job_id, now, already, not_before=held, state=state)

    def resume_requeue(self, attempt: int, job_id: str, now: float, not_before: float | None,
                       state: JobState | None = None) -> None:
        """A controller stopped around the requeue of ``job_id`` as ``attempt``: fenced again (it
        may have died before the fence) and asked again unless the scheduler took the first ask,
        after what is left of the backoff (the job's ``state`` at its failure: a CANCELLED seen
        now, and not then, is a person's, while no controller ran)."""
        write_fence(self.run.paths, Fence(attempt, job_id, self.drill_id))
        self.requeuer.requeue(attempt, job_id, now, already=self._requeue_took(attempt, job_id), not_before=not_before,
                              state=state)

    def _requeue_took(self, attempt: int, job_id: str) -> bool:
        """Did the scheduler requeue ``job_id`` as ``attempt`` before the controller that asked died?
        Yes if the job is queued again or has started as that attempt: asking again would kill the
        attempt's run and start it over. (A job still in the failed state it had: no.)"""
        if any(path.exists() for path in self.run.paths.event_files(attempt)):
            return True
        try:
            state = self.backend.poll([job_id]).get(job_id, JobState.UNKNOWN)
        except CommandError:
            return False  # asked again: a requeue of a job that is already queued again is refused, then seen
        return state is JobState.PENDING or state is JobState.REQUEUED

    def relaunch(self, attempt: int, job_id: str, now: float, go_at: float | None = None) -> None:
        """The next attempt in the job that is already running (in-allocation): recorded and
        fenced like a submission, then the go — the fence naming this attempt and the job, which
        the batch script waits for — with the nodes to keep off beside it. The go waits for
        ``go_at`` (the policy's backoff, recorded with the attempt: a controller started meanwhile
        waits too); the job is watched from now (a person's cancel, its end)."""
        held = go_at is not None and go_at > now
        with self.ledger.transaction():
            job = self._begin(attempt, job_id)
            if held:
                self.ledger.update_attempt(self.run.run_id, attempt, not_before=go_at)
        if job.exclude_nodes:
            exclude_file = self.run.paths.relaunch_exclude_file(attempt)
            exclude_file.parent.mkdir(parents=True, exist_ok=True)
            exclude_file.write_text(",".join(job.exclude_nodes) + "\n")
        log.info("%s: attempt %d relaunches in job %s%s%s", self.run.run_id, attempt, job_id,
                 f", off {', '.join(job.exclude_nodes)}" if job.exclude_nodes else "",
                 f", after the backoff ({go_at - now:.1f} s)" if held and go_at is not None else "")
        if held and go_at is not None:
            self.hold_go(attempt, job_id, go_at)
            return
        self.starter.accept(attempt, Submission(job_id, accepted_at=time.time()))

    def hold_go(self, attempt: int, job_id: str, at: float) -> None:
        """Watch ``attempt`` in ``job_id`` now, its go given at ``at`` (``give_go``): accepted then."""
        self.starter.accept(attempt, Submission(job_id, accepted_at=at), fence=False)
        self.pending_go = PendingGo(attempt, job_id, at)

    def give_go(self, watch: AttemptWatch, now: float) -> None:
        """The held go, once its backoff has passed, if ``watch`` is still of its attempt (one that
        ended meanwhile, its job gone, takes its go with it: the fence is never moved back)."""
        go = self.pending_go
        if go is None:
            return
        if watch.attempt != go.attempt or watch.job_id != go.job_id:
            self.pending_go = None
            return
        watch.go_at = go.at  # no start clock before the go
        if now < go.at:
            return
        self.pending_go = None
        write_fence(self.run.paths, Fence(go.attempt, go.job_id, self.drill_id))
        self.ledger.update_attempt(self.run.run_id, go.attempt, accepted=time.time())
        log.info("%s: attempt %d: the go in job %s, after its backoff", self.run.run_id, go.attempt, go.job_id)

    def follow_warm(self, attempt: int, job_id: str) -> None:
        """warm: the job's coordinator made ``attempt`` itself (it fenced it and sent its plans, which
        is its acceptance): recorded and watched here, the fence left to the job (writing it from here
        could name an attempt the job has already left behind)."""
        self._begin(attempt, job_id, fence=False)
        log.info("%s: attempt %d re-forms warm in job %s", self.run.run_id, attempt, job_id)
        # Accepted when the coordinator planned it: the recovery reads that from its warm_plan event.
        self.starter.accept(attempt, Submission(job_id, accepted_at=time.time()), fence=False)

    def _begin(self, attempt: int, job_id: str, fence: bool = True) -> RankJob:
        """An attempt that runs in ``job_id``, already there: recorded under that job's name and
        array element (those of the first attempt that ran in it), so a restarted controller looks
        up that job, not another attempt's nor every element of its array."""
        first = next(row for row in self.ledger.attempts(self.run.run_id) if row.job_id == job_id)
        return self.starter.begin_attempt(attempt, job_name=first.job_name, array_index=first.array_index, fence=fence)
