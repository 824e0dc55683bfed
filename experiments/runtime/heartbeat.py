"""Per-rank progress lines: the only way the controller sees a hang (a live process, no steps).

Bounded rate, because a fast workload would otherwise spend its time appending to shared storage;
but the step before a checkpoint and the final step are always written, so lost work (last step
reached minus resume step) can be computed exactly at those points.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from experiments.layout import Heartbeat, append_json_line, record_dict


class HeartbeatWriter:
    def __init__(
        self, path: Path, attempt: int, interval_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.attempt = attempt
        self.interval_s = interval_s
        self.clock = clock
        self.last_time: float | None = None
        self.last_step: int | None = None

    def beat(self, step: int, force: bool = False) -> bool:
        """Append a heartbeat unless one was written less than ``interval_s`` ago; True if written."""
        now = self.clock()
        if not force and self.last_time is not None and now - self.last_time < self.interval_s:
            return False
        append_json_line(self.path, record_dict(Heartbeat(attempt=self.attempt, step=step, time=now)))
        self.last_time = now
        self.last_step = step
        return True
