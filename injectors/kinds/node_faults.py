"""What the node kinds (node-crash, network-partition) share: which node of the job's allocation
they hit, the site's own commands for a cluster that is not the project's, and the pattern
"break it, wait, mend it" (the mending always runs: a drill never leaves a node broken)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from injectors.kinds.base import FaultOptions, FaultOutcome, FaultTask, JobControl
from injectors.targets import TargetRefused


class SiteCommands(BaseModel):
    """A site's commands for this kind (argument lists; ``{node}`` is the node's name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    act: list[str] = Field(min_length=1, description="breaks the node, e.g. [ipmitool, ..., power, off]")
    mend: list[str] = Field(min_length=1, description="mends it and returns once Slurm may use it again")


class NodeFaultOptions(FaultOptions):
    # Index into the job's nodes in allocation order (0: the batch script's node; -1: the last).
    node: int = Field(-1, description="which node of the job's allocation: 0 is the batch host, -1 the last")
    command: SiteCommands | None = Field(None, description="a site's own commands (default: scripts/cluster)")


def node_index_problem(index: int, nodes: int) -> str | None:
    if -nodes <= index < nodes:
        return None
    return f"names node {index}, but the job has {nodes} node(s) (valid: {-nodes}..{nodes - 1})"


def describe_node(options: dict[str, Any]) -> str:
    index = int(options.get("node", -1))
    return {0: "node 0 (the batch host)", -1: "the last node"}.get(index, f"node {index}")


def pick_node(control: JobControl, index: int) -> str:
    nodes = control.nodes()
    if not nodes:
        raise TargetRefused(f"job {control.job_id}: the scheduler lists no nodes for it", gone=True)
    if not -len(nodes) <= index < len(nodes):
        raise TargetRefused(f"job {control.job_id} has nodes {', '.join(nodes)}: there is no node {index}")
    return nodes[index]


def break_wait_mend(kind: str, task: FaultTask, control: JobControl, actions: tuple[str, str],
                    hold_s: float | None) -> FaultOutcome:
    """``actions``: the cluster script's (break, mend) names; the site's commands replace both.
    ``hold_s`` None: broken for the rest of the drill (mended when it ends)."""
    control.verify_running()
    node = pick_node(control, int(task.options.get("node", -1)))
    site = task.options.get("command") or {}
    at = time.time()
    if hold_s is None:
        control.mend_at_drill_end(actions[1], node, site.get("mend"))  # owed before it is broken
        broke = control.cluster(actions[0], node, site.get("act"))
        control.acted(at, node)
        return FaultOutcome(kind=kind, target=f"node {node}", at=at, node=node,
                            detail=f"{broke}; for the rest of the drill ({actions[1]} when it ends)")
    broke = control.cluster(actions[0], node, site.get("act"))
    control.acted(at, node)
    time.sleep(hold_s)
    try:
        mended = control.cluster(actions[1], node, site.get("mend"))
    except TargetRefused as error:  # it did act: the fault stands, the failure to mend is told
        mended = f"NOT MENDED: {error}"
    return FaultOutcome(kind=kind, target=f"node {node}", at=at, node=node,
                        detail=f"{broke}; {hold_s:g} s later: {mended}")
