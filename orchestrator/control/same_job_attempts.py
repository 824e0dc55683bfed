"""The next attempt in the job that is already there — relaunched (in-allocation), requeued
(requeue) or re-formed by the job's own coordinator (warm) — recorded and fenced as the tracker
records a submission, before the scheduler (orchestrator.strategies.same_job) or the job is told."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from experiments.layout import RankJob
from experiments.runtime.fence import Fence, write_fence
from orchestrator.backends.base import Backend, Submission
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError
from orchestrator.record.ledger import Ledger
from orchestrator.states import JobState
from orchestrator.strategies.same_job import REQUEUING, Requeuer

log = logging.getLogger(__name__)


class AttemptStarter(Protocol):
    """The tracker's two steps of every attempt: recorded and fenced, then accepted and watched."""

    def begin_attempt(self, attempt: int, job_name: str | None = None, array_index: int | None = None,
                      durable: bool = True, fence: bool = True) -> RankJob: ...

    def accept(self, attempt: int, submission: Submission, durable: bool = True, fence: bool = True) -> None: ...


class SameJobAttempts:
    def __init__(self, run: RunConfig, backend: Backend, ledger: Ledger, drill_id: str, starter: AttemptStarter,
                 requeuer: Requeuer) -> None:
        self.run, self.backend, self.ledger, self.drill_id = run, backend, ledger, drill_id
        self.starter, self.requeuer = starter, requeuer

    def requeue(self, attempt: int, job_id: str, now: float, already: bool) -> None:
        """The next attempt is the same job, requeued: recorded, and named in the fence (job and
        attempt) before the scheduler is asked, so that the job's next start runs as it."""
        # One transaction: an attempt recorded without its job would be looked up by name after a
        # crash, and the lookup finds the failed job of the attempt before (not yet requeued).
        with self.ledger.transaction():
            self._begin(attempt, job_id, fence=False)
            self.ledger.update_attempt(self.run.run_id, attempt, job_id=job_id, state=REQUEUING)
        write_fence(self.run.paths, Fence(attempt, job_id, self.drill_id))
        self.requeuer.requeue(attempt, job_id, now, already)

    def resume_requeue(self, attempt: int, job_id: str, now: float) -> None:
        """A controller stopped around the requeue of ``job_id`` as ``attempt``: fenced again (it
        may have died before the fence) and asked again unless the scheduler took the first ask."""
        write_fence(self.run.paths, Fence(attempt, job_id, self.drill_id))
        self.requeuer.requeue(attempt, job_id, now, already=self._requeue_took(attempt, job_id))

    def _requeue_took(self, attempt: int, job_id: str) -> bool:
        """Did the scheduler requeue ``job_id`` as ``attempt`` before the controller that asked died?
        Yes if the job is queued again or has started as that attempt: asking again would kill the
        attempt's run and start it over. (A job still in the failed state it had: no.)"""
        if self.run.paths.events_file(attempt).exists():
            return True
        try:
            state = self.backend.poll([job_id]).get(job_id, JobState.UNKNOWN)
        except CommandError:
            return False  # asked again: a requeue of a job that is already queued again is refused, then seen
        return state is JobState.PENDING or state is JobState.REQUEUED

    def relaunch(self, attempt: int, job_id: str) -> None:
        """The next attempt in the job that is already running (in-allocation): recorded and
        fenced like a submission, then the go — the fence naming this attempt and the job, which
        the batch script waits for — with the nodes to keep off beside it."""
        job = self._begin(attempt, job_id)
        if job.exclude_nodes:
            exclude_file = self.run.paths.relaunch_exclude_file(attempt)
            exclude_file.parent.mkdir(parents=True, exist_ok=True)
            exclude_file.write_text(",".join(job.exclude_nodes) + "\n")
        log.info("%s: attempt %d relaunches in job %s%s", self.run.run_id, attempt, job_id,
                 f", off {', '.join(job.exclude_nodes)}" if job.exclude_nodes else "")
        self.starter.accept(attempt, Submission(job_id, accepted_at=time.time()))

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
