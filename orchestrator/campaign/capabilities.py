"""What each backend can do, said once: a typed set per backend, and for every capability it lacks,
why. The spec checks strategies and resources against it (a campaign that needs what its backend
lacks is refused with the reason), the backends declare it as theirs (``Backend.capabilities``),
and the callers ask it before they call (tests/unit/test_strategy_objects.py checks that each backend
class implements exactly the actions of its set)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping


class Capability(StrEnum):
    MULTI_NODE = "multi-node"  # a job on more than one node
    ARRAYS = "arrays"  # one scheduler array that the scheduler throttles itself (submit_array)
    EXCLUDE_NODES = "exclude-nodes"  # keep an attempt off named nodes (restart.policy exclude_node)
    SIGNAL_RANKS = "signal-ranks"  # the scheduler signals the job's ranks, not its batch script
    REQUEUE = "requeue"  # the scheduler runs the same job again (restart.strategy requeue)
    KILL_RANK_STEP = "kill-rank-step"  # end a launch of the ranks and keep the allocation
    SET_TIME_LEFT = "set-time-left"  # move a running job's walltime (the timeout fault)
    JOB_NODES = "job-nodes"  # the scheduler lists a job's nodes (node faults)
    SPARE_NODES = "spare-nodes"  # a dead node's ranks move to a spare node of the allocation


@dataclass(frozen=True)
class BackendCapabilities:
    backend: str
    offers: frozenset[Capability]
    lacks: Mapping[Capability, str]  # every capability not offered -> why, in words

    def __post_init__(self) -> None:
        unexplained = set(Capability) - self.offers - set(self.lacks)
        if unexplained or self.offers & set(self.lacks):
            raise ValueError(f"{self.backend}: every capability is offered or explained once "
                             f"({sorted(unexplained or self.offers & set(self.lacks))})")

    def __contains__(self, capability: object) -> bool:
        return capability in self.offers

    def why_not(self, capability: Capability) -> str | None:
        """None where the backend offers ``capability``; else why it does not."""
        return None if capability in self.offers else f"the {self.backend} backend {self.lacks[capability]}"


LOCAL = BackendCapabilities("local", frozenset({Capability.KILL_RANK_STEP}), {
    Capability.MULTI_NODE: "runs on one node",
    Capability.ARRAYS: "has no scheduler arrays (its runs go out one by one within parallel_runs)",
    Capability.EXCLUDE_NODES: "has one node, none to keep an attempt off",
    Capability.SIGNAL_RANKS: "has no scheduler to signal the ranks (the agent signals the verified ranks)",
    Capability.REQUEUE: "has no scheduler queue to put a job back in",
    Capability.SET_TIME_LEFT: "cannot move a running job's time limit (submitit's local job keeps its own)",
    Capability.JOB_NODES: "has no scheduler that lists a job's nodes",
    Capability.SPARE_NODES: "has one node, none to spare",
})
PBS = BackendCapabilities("pbs", frozenset({Capability.MULTI_NODE, Capability.ARRAYS, Capability.SET_TIME_LEFT}), {
    Capability.EXCLUDE_NODES: "cannot keep a job off named nodes (qsub has no exclusion list)",
    Capability.SIGNAL_RANKS: "has no command that signals only the ranks (the agent signals the verified ranks)",
    Capability.REQUEUE: "cannot requeue a job (the PBS wrappers' qrerun does not work)",
    Capability.KILL_RANK_STEP: "has no rank step the scheduler ends alone (the agent kills the verified ranks)",
    Capability.JOB_NODES: "does not list a job's nodes",
    Capability.SPARE_NODES: "launches with mpiexec, which cannot move a dead node's ranks to a spare",
})
SLURM = BackendCapabilities("slurm", frozenset(Capability), {})

BACKENDS: dict[str, BackendCapabilities] = {caps.backend: caps for caps in (LOCAL, SLURM, PBS)}
