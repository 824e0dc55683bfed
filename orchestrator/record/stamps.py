"""Which clock stamped which moment of a drill: the one place that knows it.

The login node's clock (the controller's) is the reference. A fault that acts from here (the
scheduler's and the cluster's kinds) is stamped on it; one an agent acts out, on the node that
acted first. The batch script's events (a job's start, its launch's exit, the warm coordinator's
reports) are stamped on the batch host; a rank's events and heartbeats on its node; the
scheduler's own end time on a clock nobody reads.
"""

from __future__ import annotations

from experiments.layout import (
    EVENT_JOB_START,
    EVENT_PROCESS_START,
    EVENT_STAMPED_ON,
    EVENT_WARM_FAILURE,
    EVENT_WARM_FORMED,
    EVENT_WARM_PLAN,
    RunPaths,
    first_event,
    read_attempt_events,
)
from injectors.kinds import get_kind
from injectors.kinds.base import Site
from injectors.targets import TargetRefused, read_identity
from orchestrator.record.clocks import LOGIN, SCHEDULER, UNKNOWN_NODE, load_clocks

# Events the batch script's job writes, each with the node that stamped it: the job's start, and
# the warm coordinator's (a re-formed generation's attempt has no job_start of its own).
BATCH_EVENTS = (EVENT_JOB_START, EVENT_WARM_PLAN, EVENT_WARM_FAILURE, EVENT_WARM_FORMED)


def batch_host(paths: RunPaths, attempt: int) -> str:
    """The node whose clock stamped ``attempt``'s batch script events: its job start's, or its warm
    coordinator's; rank 0's start's on the local backend (one host)."""
    events = read_attempt_events(paths, attempt)
    for event in events:
        if event.name in BATCH_EVENTS and (node := event.fields.get(EVENT_STAMPED_ON) or
                                           (event.name == EVENT_JOB_START and event.fields.get("node"))):
            return str(node)
    start = first_event(events, EVENT_PROCESS_START)
    return str(start.fields.get("node") or UNKNOWN_NODE) if start is not None else UNKNOWN_NODE


def rank_node(paths: RunPaths, attempt: int, rank: int) -> str:
    """The node rank ``rank`` of ``attempt`` ran on (its identity file), whose clock stamped its records."""
    try:
        return read_identity(paths.root, attempt, rank).node
    except TargetRefused:
        return UNKNOWN_NODE


def fault_clock(kind: str, node: str | None) -> str:
    """A fault's moment: this clock for a kind that acts from here, else the node that acted first
    (listed first)."""
    if get_kind(kind).site is Site.CONTROLLER or not node:
        return LOGIN
    return node.split(",")[0]


def evidence_clock(paths: RunPaths, evidence: str, attempt: int, silent_node: str | None = None) -> str:
    """The clock a failure's moment was stamped on, by the evidence it comes from (a hang's last
    heartbeat: the silent rank's node, where it is known)."""
    if evidence in ("step_exit", "warm"):  # the batch script's event, the job's coordinator's
        return batch_host(paths, attempt)
    if evidence == "scheduler_end":
        return SCHEDULER
    if evidence in ("last_heartbeat", "node_check"):  # a last beat: the silent (the lost) node's clock
        return silent_node or UNKNOWN_NODE
    return LOGIN  # the controller's own look (poll, detection)


def rank_offsets(paths: RunPaths, attempt: int, ranks: int) -> list[float]:
    """Each rank's clock of ``attempt`` minus the login node's (0 where it was not read): a rank's
    heartbeat at ``t`` was at ``t - offset`` on the login clock."""
    clocks = load_clocks(paths.clocks_file(attempt))
    if clocks.one_clock or not clocks.readings:
        return [0.0] * ranks
    offsets = []
    for rank in range(ranks):
        reading = clocks.readings.get(rank_node(paths, attempt, rank))
        offsets.append(reading.offset_s if reading is not None else 0.0)
    return offsets
