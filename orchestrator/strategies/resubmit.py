"""restart.strategy resubmit: every failure a new job from the controller; the failed one is closed."""

from __future__ import annotations

from orchestrator.campaign.strategies import TRAITS, StrategyName
from orchestrator.strategies.base import Answer, Continuation, FailureFacts, RestartStrategy


class Resubmit(RestartStrategy):
    traits = TRAITS[StrategyName.RESUBMIT]

    def on_failure(self, facts: FailureFacts) -> Answer:
        return Answer(Continuation.NEW_JOB, facts.leave_or_close())
