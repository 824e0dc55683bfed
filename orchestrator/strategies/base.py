"""What a restart strategy decides when an attempt fails: how the run goes on (a new job, the ranks
launched again in the job, the job requeued, or the re-formation the job's warm coordinator already
made) and what becomes of the failed attempt's job. The tracker (orchestrator/control/tracker.py)
journals and carries out the answer; each strategy's module says only the answer."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from enum import Enum

from orchestrator.campaign.strategies import StrategyTraits


class Continuation(Enum):
    """How the run goes on, and so how the next attempt is named and fenced (the fence,
    experiments/runtime/fence.py, names the current attempt and then its job):

    - NEW_JOB: the controller submits it under a name of its own; fenced before the submission,
      with its job once the scheduler accepted it.
    - RELAUNCH: the job's batch script launches the ranks again; recorded under the first attempt's
      job name; the fence naming the attempt and the job is the go the script waits for.
    - REQUEUE: the scheduler runs the same job again; recorded like a relaunch; fenced with the job
      before the scheduler is asked, so the job's next start runs as it.
    - FOLLOW_WARM: the job already made it and fenced it (warm's coordinator; under elastic, the
      supervisor of torchrun's restarted workers); the controller records and watches it, and
      writes no fence (it could name an attempt the job has left behind).
    """

    NEW_JOB = "new job"
    RELAUNCH = "relaunch"
    REQUEUE = "requeue"
    FOLLOW_WARM = "follow warm"

    @property
    def in_same_job(self) -> bool:
        return self is not Continuation.NEW_JOB


class FailedJob(Enum):
    """What becomes of the failed attempt's job."""

    LEFT = "left"  # it ended, or goes on as the next attempt: nothing to do
    CLOSED = "closed"  # its ranks exited and the job is ending by itself: watched until it has ended
    CANCELLED = "cancelled"  # a hang or a stuck start would hold its nodes: cancelled, then watched
    STEP_ENDED = "step ended"  # a hung launch ended alone; the job keeps its allocation for the next


@dataclass(frozen=True)
class FailureFacts:
    """The facts about the failed attempt's job that a strategy's answer depends on."""

    job_ended: bool  # the scheduler says the job is over
    requeued: bool  # the scheduler requeued the job itself (a preemption that requeues)
    warm_reformed: bool  # the job's warm coordinator reported the failure (and re-formed)
    launch_exited: bool  # the ranks' launch ended (its exit was seen): nothing of it still runs
    # The scheduler is taking the job back (a preemption, its walltime: the ranks saved on its
    # warning): whatever would go on in the job goes with it.
    job_taken_back: bool = False

    @property
    def job_goes_on(self) -> bool:
        """The job outlives the failure: a next attempt can run in it."""
        return not (self.job_ended or self.requeued or self.job_taken_back)

    def leave_or_close(self) -> FailedJob:
        """A job that is not the next attempt's: left if it ended, else closed (cancelled first
        if its ranks still hold its nodes)."""
        if self.job_ended:
            return FailedJob.LEFT
        return FailedJob.CLOSED if self.launch_exited else FailedJob.CANCELLED


@dataclass(frozen=True)
class Answer:
    continuation: Continuation
    failed_job: FailedJob


class RestartStrategy(abc.ABC):
    traits: StrategyTraits

    @abc.abstractmethod
    def on_failure(self, facts: FailureFacts) -> Answer:
        """How the run goes on after a failed attempt, and what becomes of its job."""
