"""A clock a test sets by hand (``clock.now += 0.3``), for code that takes ``clock=time.time``."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
