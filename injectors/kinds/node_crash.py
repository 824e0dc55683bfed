"""node-crash: a node dies as in a power loss (its slurmd and every process of the job on it
SIGKILLed at one instant) and stays down for ``down_s``, then comes back (slurmd starts again and
registers). On the project's own cluster through ``scripts/cluster node-crash`` / ``node-restore``
(which alone owns its daemons); on a site's cluster only with the site's commands in the spec."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from injectors.kinds.base import FaultKind, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.kinds.node_faults import NodeFaultOptions, break_wait_mend, describe_node


class NodeCrashOptions(NodeFaultOptions):
    kind: Literal["node-crash"] = "node-crash"
    down_s: float | None = Field(15.0, ge=0, le=86400, description=(
        "how long the node stays down before it returns; null: for the rest of the drill (it returns "
        "when the drill ends)"))


class NodeCrash(FaultKind):
    name = "node-crash"
    target = Target.NODE
    site = Site.CONTROLLER
    options = NodeCrashOptions
    works_on = ("slurm",)

    def halts_target(self, signal_name: str) -> bool:
        return True

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        down = options.get("down_s", 15.0)
        return f"{describe_node(options)} (down {'for the rest of the drill' if down is None else f'{down:g} s'})"

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        down = task.options.get("down_s", 15.0)
        return break_wait_mend(self.name, task, control, ("node-crash", "node-restore"),
                               None if down is None else float(down))
