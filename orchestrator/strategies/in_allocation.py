"""restart.strategy in-allocation: the job outlives its failed rank launch and is the next
attempt's (a hung launch is ended alone, the nodes kept), unless the allocation itself has ended or
the scheduler requeued the job: then a new job, as resubmit."""

from __future__ import annotations

from orchestrator.campaign.strategies import TRAITS, StrategyName
from orchestrator.strategies.base import Answer, Continuation, FailedJob, FailureFacts, RestartStrategy


class InAllocation(RestartStrategy):
    traits = TRAITS[StrategyName.IN_ALLOCATION]

    def on_failure(self, facts: FailureFacts) -> Answer:
        if not facts.job_goes_on:
            return Answer(Continuation.NEW_JOB, facts.leave_or_close())
        return Answer(Continuation.RELAUNCH, FailedJob.LEFT if facts.launch_exited else FailedJob.STEP_ENDED)
