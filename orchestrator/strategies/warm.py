"""restart.strategy warm: the job's coordinator answers a failure itself (a spare in the dead
rank's place, or a spare set for every rank) and fences the next attempt, which the controller only
follows. A failure the coordinator did not report (the job ended, or was found hung or stuck from
outside) gets a new job, as resubmit."""

from __future__ import annotations

from orchestrator.campaign.strategies import TRAITS, StrategyName
from orchestrator.strategies.base import Answer, Continuation, FailedJob, FailureFacts, RestartStrategy


class Warm(RestartStrategy):
    traits = TRAITS[StrategyName.WARM]

    def on_failure(self, facts: FailureFacts) -> Answer:
        if facts.warm_reformed and not facts.job_ended and not facts.job_taken_back:
            return Answer(Continuation.FOLLOW_WARM, FailedJob.LEFT)
        return Answer(Continuation.NEW_JOB, facts.leave_or_close())
