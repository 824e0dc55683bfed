"""Reading compute nodes' clocks against the login node's, while an attempt's job holds them.

Once an attempt's ranks have registered (their identity files name their nodes), the controller
talks to ``injectors.probe echo`` on each of the attempt's nodes (the ranks' and the batch host's),
inside the job's allocation as the fault agent runs there, and writes the readings to the
attempt's clocks file (orchestrator.record.clocks). The talk runs on a thread of its own: the
control loop never waits for it. A reading younger than REUSE_S is used again (its bounds widened
by the drift allowed since): a drill of many short attempts reads each node once a minute or two,
not once an attempt. The local backend's moments are all this host's: one clock, nothing to read.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from experiments.layout import RunPaths
from injectors.probe import ECHO_READY
from injectors.targets import TargetRefused, read_identity
from orchestrator.backends.base import NotSupported
from orchestrator.commands import CommandError, Conversation
from orchestrator.record.clocks import (
    UNKNOWN_NODE,
    AttemptClocks,
    ClockReading,
    Exchange,
    load_clocks,
    offset_of,
    save_clocks,
)
from orchestrator.record.stamps import batch_host

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

log = logging.getLogger(__name__)

PINGS = 16
ANSWER_TIMEOUT_S = 30.0  # the first answer waits for the step to start on the node
STRAY_LINES = 50  # lines a site's Python may print before the probe's own
REUSE_S = 120.0
PROBE_ARGV = ["-m", "injectors.probe", "echo"]


def read_offset(probe: Conversation, pings: int = PINGS) -> ClockReading:
    """Talk to a started ``injectors.probe echo``: its ready line (what a site prints before it is
    skipped), then ``pings`` exchanges."""
    for _ in range(STRAY_LINES):
        if probe.read_line(ANSWER_TIMEOUT_S) == ECHO_READY:
            break
    else:
        raise probe.failed(f"no {ECHO_READY!r} line among its first {STRAY_LINES}")
    exchanges = []
    for _ in range(pings):
        asked_at = time.time()
        probe.say("t")
        answer = probe.read_line(ANSWER_TIMEOUT_S)
        try:
            node_time = float(answer)
        except ValueError:
            raise probe.failed(f"answered {answer[:80]!r}, not its clock") from None
        exchanges.append(Exchange(asked_at, node_time, time.time()))
    return offset_of(exchanges)


def attempt_nodes(paths: RunPaths, attempt: int, ranks: int) -> list[str]:
    """The nodes whose clocks stamped ``attempt``'s moments: its batch host (or warm coordinator's)
    and its ranks' nodes."""
    nodes: list[str] = []
    host = batch_host(paths, attempt)
    if host != UNKNOWN_NODE:
        nodes.append(host)
    for rank in range(ranks):
        try:
            node = read_identity(paths.root, attempt, rank).node
        except TargetRefused:
            continue  # not registered (yet): its moments are its node's, read with another attempt or not at all
        if node not in nodes:
            nodes.append(node)
    return nodes


class ClockBook:
    """The drill's readings of its nodes' clocks (node -> newest), shared by every run's tracker."""

    def __init__(self, backend: "Backend") -> None:
        self.backend = backend
        self._readings: dict[str, ClockReading] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="clocks")

    def read_attempt(self, paths: RunPaths, attempt: int, ranks: int, job_id: str) -> "Future[AttemptClocks]":
        """Read the clocks of ``attempt``'s nodes (in the background) and write its clocks file."""
        future = self._pool.submit(self._read_attempt, paths, attempt, ranks, job_id)
        future.add_done_callback(lambda done: _log_failure(done, paths, attempt))
        return future

    def close(self) -> None:
        """No new read; a read under way ends within its conversations' timeouts (the drill's end waits)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _read_attempt(self, paths: RunPaths, attempt: int, ranks: int, job_id: str) -> AttemptClocks:
        path = paths.clocks_file(attempt)
        if self.backend.one_clock:
            clocks = AttemptClocks(one_clock=True)
        else:
            clocks = load_clocks(path)  # what an earlier controller read of this attempt stands
            for node in attempt_nodes(paths, attempt, ranks):
                if node in clocks.readings:
                    continue
                try:
                    clocks.readings[node] = self._reading(job_id, node)
                    clocks.unmeasured.pop(node, None)
                except (CommandError, NotSupported, OSError, ValueError) as error:
                    why = error.summary if isinstance(error, CommandError) else f"{type(error).__name__}: {error}"
                    older = self._older_reading(node)
                    if older is not None:  # the node's last reading, its bounds widened by its age
                        clocks.readings[node] = older
                        clocks.unmeasured.pop(node, None)
                    else:
                        clocks.unmeasured[node] = why
                    log.info("%s attempt %d: the clock of %s was not read (%s)%s", paths.root.name, attempt, node,
                             why, "; its last reading stands" if older is not None else "")
        save_clocks(path, clocks)
        return clocks

    def _older_reading(self, node: str) -> ClockReading | None:
        with self._lock:
            return self._readings.get(node)

    def _reading(self, job_id: str, node: str) -> ClockReading:
        known = self._older_reading(node)
        if known is not None and time.time() - known.measured_at < REUSE_S:
            return known
        with self.backend.talk_on_node(job_id, node, PROBE_ARGV) as probe:
            reading = read_offset(probe)
        with self._lock:
            self._readings[node] = reading
        return reading


def _log_failure(done: "Future[AttemptClocks]", paths: RunPaths, attempt: int) -> None:
    """A read that raised (nobody waits on its result): said, not lost."""
    if not done.cancelled() and done.exception() is not None:
        log.warning("%s attempt %d: its nodes' clocks were not read: %s", paths.root.name, attempt, done.exception())
