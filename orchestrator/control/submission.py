"""Getting one attempt of a run to the scheduler: one try at a time, and after a failed try first a
look for the job (the scheduler may have taken it although the command failed: a reply that timed
out), then another try after a backoff, until ``restart.submit_retries`` is spent.

The attempt is already in the ledger and the fence (the tracker's ``begin_attempt``) before its
first try, so a controller that stops at any moment is replaced by one that looks it up instead of
submitting it twice; a late acceptance of a try given up on is fenced off by its job id.

The commands run off the controller's loop (orchestrator.backends.scheduler_calls): a try is asked,
and its answer taken in a later round; the ledger is written only then, on the loop's thread.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from experiments.layout import RankJob
from experiments.runtime.fence import Fence, write_fence
from orchestrator.backends.base import AttemptRef, Backend, Submission, SubmitRefusal
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import RestartConfig
from orchestrator.commands import CommandError, one_line
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.render.scripts import TemplateError, attempt_job_name

log = logging.getLogger(__name__)

SUBMIT_FAILED = "SUBMIT_FAILED"  # an attempt whose submission failed every try
# A submission the site held back (its limit of submitted jobs) is tried again this often.
HELD_RETRY_S = 10.0
HELD_LOG_EVERY = 30  # a held try's warning, once and then every this many


@dataclass
class PendingSubmission:
    """An attempt recorded but not (known to be) accepted yet: tried again after a failure."""

    attempt: int
    job: RankJob
    failures: int = 0
    next_try_at: float = 0.0
    error: str = ""
    looked_up: bool = False  # this try's look for the job found none: it is submitted now
    holds: int = 0  # tries the site held back (a limit of submitted jobs): no failures
    held_since: float | None = None  # the first of them
    asked: "Future[Submission | list[str]] | None" = None  # the command in flight: a submission, or the look


class Accepted(Protocol):
    """(attempt, submission); ``fence`` False: the submission's call already fenced the run on its job."""

    def __call__(self, attempt: int, submission: Submission, *, fence: bool = True) -> None: ...


@dataclass(frozen=True)
class SubmissionHooks:
    """What the tracker does when a submission ends either way, and how it cancels a duplicate."""

    accepted: Accepted
    gave_up: Callable[[int, float], None]  # (attempt, now): every try failed; the policy decides
    refused: Callable[[str, float], None]  # (why, now): the scheduler refuses the job as asked: the run gives up
    cancel: Callable[[str], None]  # a duplicate job found for the attempt


class Submitter:
    def __init__(self, run: RunConfig, backend: Backend, ledger: Ledger, drill_id: str, restart: RestartConfig,
                 hooks: SubmissionHooks, calls: SchedulerCalls | None = None) -> None:
        self.run, self.backend, self.ledger, self.drill_id, self.restart = run, backend, ledger, drill_id, restart
        self.hooks = hooks
        self.calls = calls or SchedulerCalls(off_loop=False)
        self.pending: PendingSubmission | None = None

    def submit(self, attempt: int, job: RankJob, now: float, not_before: float | None = None) -> None:
        """The first try of a recorded attempt (at ``not_before``: a policy's backoff)."""
        self.pending = PendingSubmission(attempt, job, next_try_at=now if not_before is None else not_before)
        self.try_pending(now)

    def retry(self, attempt: int, job: RankJob, error: str, now: float, not_before: float | None = None) -> None:
        """An attempt whose submission may or may not have reached the scheduler (a failed array,
        a controller stopped while submitting it): looked up first, then tried again."""
        self.pending = PendingSubmission(attempt, job, failures=1, next_try_at=max(now, not_before or now), error=error)
        self.try_pending(now)

    def try_pending(self, now: float) -> None:
        """The pending submission's next step, when it is due: a try asked of the scheduler (a look
        for the job first, after a failed try), or the answer of the one in flight taken."""
        pending = self.pending
        while pending is not None and pending is self.pending:
            if pending.asked is None:
                if now < pending.next_try_at:
                    return
                pending.asked = self._ask(pending)
            if not pending.asked.done():
                return
            asked, pending.asked = pending.asked, None
            try:
                answer = asked.result()
            except (CommandError, TemplateError, OSError) as error:
                self._failed(pending, error, now)
                return
            self._answered(pending, answer)

    def take_answer(self) -> None:
        """The answer of the try in flight, once the commands off the loop have ended (the loop
        stopped): an accepted job is recorded; anything else is the next controller's to retry."""
        pending = self.pending
        if pending is None or pending.asked is None or not pending.asked.done():
            return
        answer = pending.asked.result() if pending.asked.exception() is None else None
        if isinstance(answer, Submission):
            self.pending = None
            self.hooks.accepted(pending.attempt, answer, fence=False)

    def _ask(self, pending: PendingSubmission) -> "Future[Submission | list[str]]":
        """After a failed try, the look for the job first (the scheduler may have taken it); then
        the submission, as a single job."""
        if pending.failures and not pending.looked_up:
            ref = self._ref(pending.attempt)
            return self.calls.start(lambda: self.backend.find_submitted(ref))
        if pending.failures:
            self._as_single_job(pending.attempt)
        run, job, attempt, drill_id = self.run, pending.job, pending.attempt, self.drill_id

        def fenced_submission() -> Submission:
            # The fence names the attempt durably before the scheduler can start its job (the loop
            # wrote it, not durably, when it recorded the attempt: a restarted controller's retry
            # may find none), then its job once the scheduler gave it: both here, off the loop.
            write_fence(run.paths, Fence(attempt, None, drill_id))
            submission = self.backend.submit(run, job)
            write_fence(run.paths, Fence(attempt, submission.job_id, drill_id))
            return submission
        return self.calls.start(fenced_submission)

    def _answered(self, pending: PendingSubmission, answer: "Submission | list[str]") -> None:
        if isinstance(answer, Submission):
            self.pending = None
            self.hooks.accepted(pending.attempt, answer, fence=False)
        elif answer:
            self.pending = None
            self._adopt_found(pending, answer)
        else:
            pending.looked_up = True  # none: submitted next, in the same round when it runs inline

    def _failed(self, pending: PendingSubmission, error: BaseException, now: float) -> None:
        refusal = self.backend.submit_refusal(error)
        if refusal is not None and refusal.held:
            self._held(pending, refusal, now)
            return
        if refusal is not None and pending.job.exclude_nodes:
            self._without_exclusions(pending, refusal.why, now)
            return
        pending.failures += 1
        pending.looked_up = False
        pending.error = one_line(error)
        if refusal is not None:  # refused as asked: no try, no attempt can succeed
            reason = f"the scheduler refused the job as asked: {refusal.why}"
            self._give_up(pending, reason, now, hook=lambda _attempt, when: self.hooks.refused(reason, when))
            return
        if pending.failures <= self.restart.submit_retries:
            delay = self.restart.submit_backoff_s * 2 ** (pending.failures - 1)
            pending.next_try_at = now + delay
            log.warning("%s: submitting attempt %d failed (%s); trying again in %.1f s", self.run.run_id,
                        pending.attempt, pending.error, delay)
            return
        self._give_up(pending, f"submission failed {pending.failures} times: {pending.error}", now)

    def _held(self, pending: PendingSubmission, refusal: SubmitRefusal, now: float) -> None:
        """A limit of submitted jobs: the same try again later (the scheduler took nothing: no look
        for the job), not a failed try; the run's turn waits as the drill's other jobs end, for
        restart.submit_hold_s at most (a limit that never clears: 0 jobs allowed)."""
        if pending.held_since is None:
            pending.held_since = now
        elif now - pending.held_since >= self.restart.submit_hold_s:  # no later attempt would fare better
            reason = (f"held by the site's limit of submitted jobs for {now - pending.held_since:.0f} s "
                      f"(restart.submit_hold_s {self.restart.submit_hold_s:g}): {refusal.why}")
            self._give_up(pending, reason, now, hook=lambda _attempt, when: self.hooks.refused(reason, when))
            return
        pending.holds += 1
        pending.looked_up = True
        pending.next_try_at = now + min(max(HELD_RETRY_S, self.restart.poll_interval_s), self.restart.submit_hold_s)
        if pending.holds == 1 or pending.holds % HELD_LOG_EVERY == 0:
            log.warning("%s: attempt %d held by the site's limit of submitted jobs (%s); tried again every %.0f s",
                        self.run.run_id, pending.attempt, refusal.why, pending.next_try_at - now)

    def _without_exclusions(self, pending: PendingSubmission, why: str, now: float) -> None:
        """Refused as asked while it stays off failed nodes: the drill's own --exclude may be what
        the site cannot place (a partition of exactly the job's nodes); the same attempt goes out
        at once without it (the scheduler took nothing), recorded so, and is refused for good only
        if it is refused again."""
        log.warning("%s: attempt %d was refused as asked while it stays off %s (%s): submitted again without "
                    "leaving them out", self.run.run_id, pending.attempt, ", ".join(pending.job.exclude_nodes), why)
        self.ledger.update_attempt(self.run.run_id, pending.attempt, excluded_nodes=None)
        pending.job = replace(pending.job, exclude_nodes=())
        pending.looked_up = True
        pending.next_try_at = now

    def held_freed(self, now: float) -> None:
        """A job of the drill ended: a submission the site held back is tried again at once."""
        pending = self.pending
        if pending is not None and pending.holds and pending.asked is None:
            pending.next_try_at = min(pending.next_try_at, now)

    def _give_up(self, pending: PendingSubmission, reason: str, now: float,
                 hook: Callable[[int, float], None] | None = None) -> None:
        """The attempt's submission failed for good: recorded, then the tracker's hook (the policy
        decides, or the run gives up)."""
        self.pending = None
        log.warning("%s: attempt %d: %s", self.run.run_id, pending.attempt, reason)
        self.ledger.update_attempt(self.run.run_id, pending.attempt, state=SUBMIT_FAILED, ended=now,
                                   detected=now, reason=reason)
        (hook or self.hooks.gave_up)(pending.attempt, now)

    def _ref(self, attempt: int) -> AttemptRef:
        row = self._row(attempt)
        return AttemptRef(self.run, attempt, row.job_name, row.array_index, row.submitted)

    def _as_single_job(self, attempt: int) -> None:
        """An attempt that was to be an array element goes out on its own next time (a late
        acceptance of the array is then fenced off by the job id)."""
        if self._row(attempt).array_index is not None:
            self.ledger.update_attempt(self.run.run_id, attempt, array_index=None,
                                       job_name=attempt_job_name(self.run, attempt, self.drill_id))

    def _adopt_found(self, pending: PendingSubmission, found: list[str]) -> None:
        """Adopt the oldest job found for the attempt; any other is a duplicate and is cancelled."""
        for duplicate in found[1:]:
            log.warning("%s: attempt %d was submitted twice; cancelling the duplicate job %s",
                        self.run.run_id, pending.attempt, duplicate)
            self.hooks.cancel(duplicate)
        self.backend.adopt(found[0], self.run, pending.job)
        self.hooks.accepted(pending.attempt, Submission(found[0], accepted_at=self._row(pending.attempt).submitted))

    def _row(self, attempt: int) -> AttemptRow:
        return next(row for row in self.ledger.attempts(self.run.run_id) if row.attempt == attempt)
