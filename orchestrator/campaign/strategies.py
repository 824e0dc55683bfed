"""The restart strategies as the spec and the batch scripts see them: a name, what each needs from
its backend, and the few facts a script or a resource check reads. What each does when an attempt
fails is its object's (orchestrator/strategies/); this table is the one place both start from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from experiments.warm.protocol import RESTART_ALL_FRAMEWORKS
from orchestrator.campaign.capabilities import BACKENDS, Capability


class StrategyName(StrEnum):
    RESUBMIT = "resubmit"  # a new job from the controller
    IN_ALLOCATION = "in-allocation"  # the batch script keeps its allocation and relaunches the ranks
    REQUEUE = "requeue"  # the scheduler's own: the same job again as the next attempt
    WARM = "warm"  # survivors keep their processes and state, a warm spare takes a dead rank's place
    ELASTIC = "elastic"  # torchrun restarts its workers in place (--max-restarts); each round an attempt


@dataclass(frozen=True)
class StrategyTraits:
    name: StrategyName
    summary: str
    needs: frozenset[Capability] = frozenset()  # the backend must offer these
    uses_spare_nodes: bool = False  # resources.spare_nodes gives it somewhere to go (else held idle)
    scheduler_requeues: bool = False  # the scheduler may requeue its jobs itself: the requeued job is the next attempt
    relaunches_in_job: bool = False  # the batch script waits for the controller's go and launches the ranks again
    warm: bool = False  # a coordinator in the job, spares beside the ranks
    # The built-in workloads it runs (None: every workload, the user's command too).
    frameworks: tuple[str, ...] | None = None
    torchrun: bool = False  # torchrun's own restart: a command launched with torchrun, in zero-code mode

    def why_not_on(self, backend: str) -> str | None:
        """Why this strategy cannot run on ``backend``; None if it can."""
        capabilities = BACKENDS[backend]
        missing = [reason for need in sorted(self.needs) if (reason := capabilities.why_not(need))]
        return "; ".join(missing) or None

    def why_not_for(self, framework: str, command: bool) -> str | None:
        """Why this strategy cannot run a workload of ``framework`` (``command``: the user's own
        script); None if it can."""
        if self.frameworks is None:
            return None
        # What runs any workload on every backend.
        instead = " or ".join(name for name, traits in TRAITS.items()
                              if traits.frameworks is None and not traits.needs and not traits.torchrun)
        if command:
            return (f"restart.strategy {self.name} re-forms the built-in workloads' process group in place; a "
                    f"command workload brings its own: use {instead}")
        if framework not in self.frameworks:
            return (f"restart.strategy {self.name} runs the {', '.join(self.frameworks)} workload(s), not "
                    f"{framework}: use {instead}")
        return None


TRAITS: dict[StrategyName, StrategyTraits] = {traits.name: traits for traits in (
    StrategyTraits(StrategyName.RESUBMIT, "a new job from the controller after every failure"),
    StrategyTraits(StrategyName.IN_ALLOCATION, "the job keeps its nodes; its ranks start again on the controller's go",
                   uses_spare_nodes=True, relaunches_in_job=True),
    StrategyTraits(StrategyName.REQUEUE, "the scheduler requeues the same job as the next attempt",
                   needs=frozenset({Capability.REQUEUE}), scheduler_requeues=True),
    StrategyTraits(StrategyName.WARM, "survivors keep their state; warm spares take the dead ranks' places",
                   uses_spare_nodes=True, warm=True, frameworks=("torch", *RESTART_ALL_FRAMEWORKS)),
    StrategyTraits(StrategyName.ELASTIC, "torchrun restarts its workers in place (--max-restarts); each round an attempt",
                   torchrun=True),
)}


def traits_of(name: str) -> StrategyTraits:
    return TRAITS[StrategyName(name)]


def strategies_on(backend: str) -> tuple[StrategyName, ...]:
    """The strategies that run on ``backend``, in the table's order."""
    return tuple(name for name, traits in TRAITS.items() if traits.why_not_on(backend) is None)
