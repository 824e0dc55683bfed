"""Per-rank progress lines: the only way the controller sees a hang (a live process, no steps).

Bounded rate, because a fast workload would otherwise spend its time appending to shared storage;
but the step before a checkpoint and the final step are always written, so lost work (last step
reached minus resume step) can be computed exactly at those points; so is the first step at or past
each step an ``at_step`` fault names (its agent, waiting on the node, acts on it: injectors/kinds/moment.py).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from experiments.layout import Heartbeat, append_json_line, record_dict
from experiments.runtime.mounts import on_network_filesystem

LOCAL_INTERVAL_S = 0.05  # a rank's heartbeat at most this often, on a local filesystem
SHARED_INTERVAL_S = 1.0  # on a network filesystem: each append a round trip to its server, from every rank


def interval_for(directory: Path, asked: float | None = None, most_s: float | None = None) -> float:
    """The heartbeat interval for a run directory in ``directory``: the spec's, else by its
    filesystem, never more than ``most_s`` (a fifth of the hang timeout)."""
    if asked is not None:
        return asked
    chosen = SHARED_INTERVAL_S if on_network_filesystem(directory) else LOCAL_INTERVAL_S
    return min(chosen, most_s) if most_s is not None else chosen


class HeartbeatWriter:
    def __init__(
        self, path: Path, attempt: int, interval_s: float, clock: Callable[[], float] = time.time,
        fault_steps: tuple[int, ...] = (),
    ) -> None:
        self.path = path
        self.attempt = attempt
        self.interval_s = interval_s
        self.clock = clock
        self.last_time: float | None = None
        self.last_step: int | None = None
        self.fault_steps = sorted(fault_steps)

    def beat(self, step: int, force: bool = False, phase: str | None = None, timeout_s: float | None = None) -> bool:
        """Append a heartbeat unless one was written less than ``interval_s`` ago; True if written."""
        now = self.clock()
        if self.fault_steps and step >= self.fault_steps[0]:  # the first beat at or past a fault's step
            force = True
            self.fault_steps = [planned for planned in self.fault_steps if planned > step]
        if not force and self.last_time is not None and now - self.last_time < self.interval_s:
            return False
        beat = Heartbeat(attempt=self.attempt, step=step, time=now, phase=phase, timeout_s=timeout_s)
        append_json_line(self.path, {k: v for k, v in record_dict(beat).items() if v is not None})
        self.last_time = now
        self.last_step = step
        return True

    @contextmanager
    def phase(self, name: str, timeout_s: float, step: int) -> Iterator[None]:
        """A long phase without steps (resume, checkpoint, finish): announced with its own timeout,
        so the controller does not take a slow save for a hang, yet catches one that never ends."""
        self.beat(step, force=True, phase=name, timeout_s=timeout_s)
        yield
        self.beat(step, force=True)
