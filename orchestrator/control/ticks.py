"""The control loop's schedule: a round every ``restart.poll_interval_s`` on the monotonic clock,
not a fixed sleep after each round's work (which stretched every detection by the work of the
round before it). A round whose work ran past its next tick starts the next one at once, and the
schedule goes on from there (no burst to catch up); how far behind the loop ran is kept for the
report's ``controller_cost`` (issue 29)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Ticks:
    interval_s: float
    clock: Callable[[], float] = time.monotonic
    rounds: int = 0
    rounds_behind: int = 0  # rounds whose work ran past the next tick
    behind_s_max: float = 0.0  # the most the loop ran behind its schedule
    _next_at: float | None = field(default=None, repr=False)

    def wait(self, stop: threading.Event) -> None:
        """Until the next tick (or ``stop``); at once where this round's work ran past it."""
        now = self.clock()
        self.rounds += 1
        self._next_at = (now if self._next_at is None else self._next_at) + self.interval_s
        behind = now - self._next_at
        if behind > 0:
            self.rounds_behind += 1
            self.behind_s_max = max(self.behind_s_max, behind)
            self._next_at = now
            return
        stop.wait(self._next_at - now)
