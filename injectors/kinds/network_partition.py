"""network-partition: a node's network is cut (its link down inside its namespace) for
``duration_s``, then restored: its ranks lose their peers and its slurmd loses the controller.
Local cluster only (``scripts/cluster partition`` / ``heal``, on the namespace addresses it made),
or a site's commands in the spec."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from injectors.kinds.base import FaultKind, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.kinds.node_faults import NodeFaultOptions, break_wait_mend, describe_node


class NetworkPartitionOptions(NodeFaultOptions):
    kind: Literal["network-partition"] = "network-partition"
    duration_s: float = Field(15.0, gt=0, le=3600, description="how long the node is cut off")


class NetworkPartition(FaultKind):
    name = "network-partition"
    target = Target.NODE
    site = Site.CONTROLLER
    options = NetworkPartitionOptions
    works_on = ("slurm",)

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return f"{describe_node(options)} (cut off {float(options.get('duration_s', 15.0)):g} s)"

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        return break_wait_mend(self.name, task, control, ("partition", "heal"),
                               float(task.options.get("duration_s", 15.0)))
