"""What the node kinds (node-crash, network-partition) share: which node of the job's allocation
they hit, the site's own commands for a cluster that is not the project's, and the pattern
"break it, wait, mend it" (the mending always runs: a drill never leaves a node broken)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from injectors.kinds.base import FaultOptions, FaultOutcome, FaultTask, JobControl
from injectors.targets import TargetRefused, read_identity


class SiteCommands(BaseModel):
    """A site's commands for this kind (argument lists; ``{node}`` is the node's name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    act: list[str] = Field(min_length=1, description="breaks the node, e.g. [ipmitool, ..., power, off]")
    mend: list[str] = Field(min_length=1, description="mends it and returns once Slurm may use it again")


class NodeFaultOptions(FaultOptions):
    # Index into the nodes of the job's ranks, in rank order (0: rank 0's, the batch host; -1: the last).
    node: int = Field(-1, description="which node of the job's ranks: 0 is rank 0's, -1 the last")
    command: SiteCommands | None = Field(None, description="a site's own commands (default: scripts/cluster)")


def node_index_problem(index: int, nodes: int) -> str | None:
    if -nodes <= index < nodes:
        return None
    return f"names node {index}, but the job has {nodes} node(s) (valid: {-nodes}..{nodes - 1})"


def describe_node(options: dict[str, Any]) -> str:
    index = int(options.get("node", -1))
    return {0: "node 0 (the batch host)", -1: "the last node"}.get(index, f"node {index}")


def rank_nodes(task: FaultTask) -> list[str]:
    """The nodes the attempt's ranks run on, in rank order (from their identity files): a job that
    holds spare nodes (in-allocation) has nodes without ranks, which a node fault is not aimed at."""
    nodes: list[str] = []
    for rank in itertools.count():
        try:
            node = read_identity(task.run_dir, task.attempt, rank).node
        except TargetRefused:
            return nodes
        if node not in nodes:
            nodes.append(node)
    return nodes


def pick_node(control: JobControl, index: int, task: FaultTask | None = None) -> str:
    allocation = control.nodes()
    with_ranks = rank_nodes(task) if task is not None else []
    nodes = [node for node in with_ranks if node in allocation] or allocation
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
    node = pick_node(control, int(task.options.get("node", -1)), task)
    site = task.options.get("command") or {}
    at = time.time()
    if hold_s is None:
        control.mend_at_drill_end(actions[1], node, site.get("mend"))  # owed before it is broken
        control.acted(at, node)
        broke = control.cluster(actions[0], node, site.get("act"))
        broke = f"{broke} (the command took {time.time() - at:.2f} s)"
        return FaultOutcome(kind=kind, target=f"node {node}", at=at, node=node,
                            detail=f"{broke}; for the rest of the drill ({actions[1]} when it ends)")
    # Owed before it is broken, as above: a controller killed while it holds, or a mend that fails,
    # leaves the mend to the end of the drill (or to the next controller), not a node down for good.
    control.mend_at_drill_end(actions[1], node, site.get("mend"))
    # Recorded as it acts, not once the command returns: the job's step fails within a tenth of a
    # second of the crash, before the cluster script is done, and the class needs the node then.
    control.acted(at, node)
    broke = control.cluster(actions[0], node, site.get("act"))
    broke = f"{broke} (the command took {time.time() - at:.2f} s)"  # stamped before it: the node went since
    time.sleep(hold_s)
    try:
        mended = control.cluster(actions[1], node, site.get("mend"))
        control.mended(actions[1], node, site.get("mend"))
    except TargetRefused as error:  # it did act: the fault stands; the mend stays owed
        mended = f"NOT MENDED (owed to the end of the drill): {error}"
    return FaultOutcome(kind=kind, target=f"node {node}", at=at, node=node,
                        detail=f"{broke}; {hold_s:g} s later: {mended}")
