"""Restarts in the job that is already there, the scheduler's side: the requeue strategy's
``scontrol requeue`` (tried again while the job is still completing), and in-allocation's end of a
hung attempt's ranks that keeps the allocation. What the tracker records for such an attempt (the
ledger row under the first attempt's job name, the fence naming the attempt and the job) comes
before; these only talk to the scheduler and the ranks. The requeue runs off the controller's loop
(orchestrator.backends.scheduler_calls, as submissions and cancels do): a scheduler that takes a
command's timeout to answer holds up no other run's detection."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from injectors.targets import TargetRefused
from orchestrator.backends.base import Backend, NotSupported, Submission
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.capabilities import Capability
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError
from orchestrator.faults.inject import kill_every_rank
from orchestrator.states import JobState

log = logging.getLogger(__name__)

REQUEUING = "REQUEUING"  # requeue: the job is being put back in the queue as this attempt
REQUEUE_RETRY_S = 2.0


@dataclass
class PendingRequeue:
    """The next attempt is the same job, to be requeued (restart.strategy requeue): tried until
    the scheduler takes it (a job still completing is refused for a moment), from ``first_try``
    (after the policy's backoff, if it has one)."""

    attempt: int
    job_id: str
    first_try: float
    next_try_at: float
    already: bool = False  # the scheduler requeued it itself (a preemption that requeues)
    error: str = ""
    # The job's state when the request was held: a CANCELLED seen later, and not the drill's, is a
    # person's (the request would bring back a job its owner ended).
    state_at_hold: JobState | None = None
    asked: "Future[None] | None" = None  # the request in flight (off the loop)

    def held(self, now: float) -> bool:
        return not self.already and now < self.first_try


class Requeuer:
    def __init__(self, run: RunConfig, backend: Backend, timeout_s: float,
                 accepted: Callable[[int, Submission], None], refused: Callable[[int, str, str, float], None],
                 calls: SchedulerCalls | None = None) -> None:
        self.run, self.backend, self.timeout_s = run, backend, timeout_s
        self.accepted, self.refused = accepted, refused  # refused(attempt, job id, why, now)
        self.calls = calls or SchedulerCalls(off_loop=False)
        self.pending: PendingRequeue | None = None

    def requeue(self, attempt: int, job_id: str, now: float, already: bool = False, not_before: float | None = None,
                state: JobState | None = None) -> None:
        """Ask the scheduler to run ``job_id`` (in ``state``) again as ``attempt`` (recorded and
        fenced already), at ``not_before`` (the policy's backoff) or now."""
        start = now if already or not_before is None else max(now, not_before)
        self.pending = PendingRequeue(attempt, job_id, first_try=start, next_try_at=start, already=already,
                                      state_at_hold=state)
        self.try_requeue(now)

    def held_job_id(self, now: float) -> str | None:
        """The job whose requeue waits out a backoff: watched meanwhile (``cancelled_while_held``)."""
        pending = self.pending
        return pending.job_id if pending is not None and pending.held(now) else None

    def cancelled_while_held(self, state: JobState | None, now: float) -> PendingRequeue | None:
        """The held request, dropped, if its job turned CANCELLED during the hold (the caller
        knows whether the drill did it); None otherwise."""
        pending = self.pending
        if pending is None or state is None or not pending.held(now):
            return None
        if pending.state_at_hold is None:
            pending.state_at_hold = state  # a controller started during the hold: its first look
            return None
        if state is JobState.CANCELLED and pending.state_at_hold is not JobState.CANCELLED:
            self.pending = None
            return pending
        return None

    def take_answer(self) -> None:
        """The answer of the request in flight, once the commands off the loop have ended (the loop
        stopped): a requeue the scheduler took is accepted (recorded, not asked again by the next
        controller, which would end the attempt it started); a refusal is the next one's to retry."""
        pending = self.pending
        if pending is None or pending.asked is None or not pending.asked.done() or pending.asked.exception() is not None:
            return
        self._took(pending)

    def _took(self, pending: PendingRequeue) -> None:
        """The scheduler requeued the job (or had itself): the attempt is accepted as that job."""
        self.pending = None
        log.info("%s: attempt %d is job %s, requeued", self.run.run_id, pending.attempt, pending.job_id)
        self.accepted(pending.attempt, Submission(pending.job_id, accepted_at=time.time()))

    def try_requeue(self, now: float) -> None:
        """The pending request's next step, when it is due: asked of the scheduler, or the answer
        of the one in flight taken (a refusal tried again every REQUEUE_RETRY_S, until timeout_s)."""
        pending = self.pending
        if pending is None or (pending.asked is None and now < pending.next_try_at):
            return
        if not pending.already:
            if pending.asked is None:
                job_id = pending.job_id
                pending.asked = self.calls.start(lambda: self.backend.requeue(job_id))
            if not pending.asked.done():
                return
            asked, pending.asked = pending.asked, None
            try:
                asked.result()
            except (CommandError, NotSupported) as error:
                pending.error = error.summary if isinstance(error, CommandError) else str(error)
                if now - pending.first_try > self.timeout_s:
                    self.pending = None
                    self.refused(pending.attempt, pending.job_id,
                                 f"the scheduler would not requeue job {pending.job_id}: {pending.error}", now)
                    return
                pending.next_try_at = now + REQUEUE_RETRY_S
                return
        self._took(pending)


def end_rank_launch(backend: Backend, run: RunConfig, attempt: int, job_id: str, started_before: int,
                    cancel: Callable[[str], None]) -> None:
    """End the rank launch of a hung attempt and keep its allocation for the next one: through
    the scheduler (Slurm: the ranks' step), else every verified rank SIGKILLed by the agent; if
    neither works, the job is cancelled (the next attempt then finds the allocation ended: a new
    job). Runs in a thread of its own: a step on a dead node takes scancel a MessageTimeout."""
    try:
        if not (backend.offers(Capability.KILL_RANK_STEP) and backend.kill_rank_step(job_id, attempt, started_before)):
            kill_every_rank(backend, run, attempt, job_id)
        return
    except (TargetRefused, CommandError) as error:
        if isinstance(error, TargetRefused) and error.gone:
            return  # the launch ended them first (the batch script ends it on the controller's go)
        log.warning("%s: killing the ranks of attempt %d (job %s) failed: %s", run.run_id, attempt, job_id,
                    error.summary if isinstance(error, CommandError) else error)
    cancel(job_id)
