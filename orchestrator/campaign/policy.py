"""The restart policy: what to do after a failure of each class (``restart.policy`` in the spec).

Each class maps to an action (``restart`` | ``give_up``), a budget of restarts for that class, whether
those restarts spend the run's failure budget (``restart.max_restarts``) and a backoff before the
next attempt (``backoff_s``, times ``backoff_factor`` for each earlier failure of the class). Whether
the failed node is left out of the next attempt (``exclude_node``, with the spare nodes of the
in-allocation strategy: to come). The defaults are what a user would expect: a person's cancel gives
up; a walltime or a preemption restarts without spending the failure budget (chained jobs are
normal); everything else restarts within ``max_restarts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.campaign.failure_classes import FailureClass

CHAINED_JOBS_BUDGET = 100  # TIMEOUT and PREEMPTED restart freely, but never forever


class PolicyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["restart", "give_up"] = "restart"
    budget: int | None = Field(None, ge=0, description="restarts after failures of this class (none: no own cap)")
    spends_budget: bool = Field(True, description="these restarts count against restart.max_restarts")
    backoff_s: float = Field(0.0, ge=0, le=3600, description="wait before the next attempt")
    backoff_factor: float = Field(1.0, ge=1, le=10, description="the wait grows by this for each earlier one")
    exclude_node: bool = Field(False, description="the next attempt stays off the node that failed (--exclude)")


DEFAULT_POLICY: dict[FailureClass, PolicyEntry] = {
    FailureClass.CANCELLED: PolicyEntry(action="give_up"),
    FailureClass.NODE_FAIL: PolicyEntry(exclude_node=True),
    FailureClass.HANG: PolicyEntry(exclude_node=True),
    FailureClass.TIMEOUT: PolicyEntry(spends_budget=False, budget=CHAINED_JOBS_BUDGET),
    FailureClass.PREEMPTED: PolicyEntry(spends_budget=False, budget=CHAINED_JOBS_BUDGET),
}


def policy_entry(policy: dict[FailureClass, PolicyEntry], failure_class: FailureClass) -> PolicyEntry:
    """The class's default entry (else a plain restart) with the fields the spec's entry sets."""
    default = DEFAULT_POLICY.get(failure_class) or PolicyEntry()
    given = policy.get(failure_class)
    if given is None:
        return default
    return default.model_copy(update={name: getattr(given, name) for name in given.model_fields_set})


@dataclass(frozen=True)
class Decision:
    restart: bool
    reason: str  # why, in words (the run's reason when it gives up)
    backoff_s: float = 0.0


def restarts_left(policy: dict[FailureClass, PolicyEntry], history: list[FailureClass], max_restarts: int) -> int:
    """What is left of restart.max_restarts after the failures of ``history``: only the classes
    that spend it count (a preemption or a walltime does not, by default), as in ``decide``."""
    return max(0, max_restarts - sum(1 for earlier in history if policy_entry(policy, earlier).spends_budget))


def decide(policy: dict[FailureClass, PolicyEntry], history: list[FailureClass], max_restarts: int) -> Decision:
    """After the failure ``history[-1]`` (``history``: every failed attempt's class, in order)."""
    failure_class = history[-1]
    entry = policy_entry(policy, failure_class)
    name = failure_class.value
    if entry.action == "give_up":
        return Decision(False, f"{name}: the policy gives up")
    same = sum(1 for earlier in history if earlier is failure_class)
    if entry.budget is not None and same > entry.budget:
        return Decision(False, f"{name}: its budget of {entry.budget} restart(s) is spent")
    spent = sum(1 for earlier in history if policy_entry(policy, earlier).spends_budget)
    if entry.spends_budget and spent > max_restarts:
        return Decision(False, f"{name}: the restart budget (max_restarts {max_restarts}) is spent")
    backoff = entry.backoff_s * entry.backoff_factor ** (same - 1)
    counted = f"{spent} of {max_restarts} spent" if entry.spends_budget else "not counted against max_restarts"
    return Decision(True, f"{name}: restart ({counted})", backoff_s=backoff)
