"""restart.strategy requeue: the scheduler runs the same job again as the next attempt. ``scontrol
requeue`` ends whatever of the job still runs (a hang: the job itself), so nothing is cancelled or
closed; the request itself, retried while the job is still completing, is same_job.Requeuer's."""

from __future__ import annotations

from orchestrator.campaign.strategies import TRAITS, StrategyName
from orchestrator.strategies.base import Answer, Continuation, FailedJob, FailureFacts, RestartStrategy


class Requeue(RestartStrategy):
    traits = TRAITS[StrategyName.REQUEUE]

    def on_failure(self, facts: FailureFacts) -> Answer:
        return Answer(Continuation.REQUEUE, FailedJob.LEFT)
