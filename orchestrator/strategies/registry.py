"""Each restart strategy's object, by the spec's name for it."""

from __future__ import annotations

from orchestrator.campaign.strategies import StrategyName
from orchestrator.strategies.base import RestartStrategy
from orchestrator.strategies.elastic import Elastic
from orchestrator.strategies.in_allocation import InAllocation
from orchestrator.strategies.requeue import Requeue
from orchestrator.strategies.resubmit import Resubmit
from orchestrator.strategies.warm import Warm

STRATEGIES: dict[StrategyName, RestartStrategy] = {
    strategy.traits.name: strategy for strategy in (Resubmit(), InAllocation(), Requeue(), Warm(), Elastic())}


def strategy_for(name: str) -> RestartStrategy:
    return STRATEGIES[StrategyName(name)]
