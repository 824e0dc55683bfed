"""Where a step changes a rank's state, and a way to stop it changing (warm sets: a survivor's state).

A data-parallel step is two parts: the all-reduce of the gradients (the collective that a dead
peer breaks or blocks) and the local update (nothing of a peer's). The update runs inside
``updating``; between updates the model, the optimizer and the step count are the state after
``completed``. ``hold`` takes the gate for good: no update starts after it, so the state it names
stays as it is while the process serves it (experiments/warm/state_channel.py) until it is ended.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class StateGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holding = threading.Lock()  # two holds at once (a request, a failed step) take the gate once
        self.completed = 0  # the last step whose update finished (or the step a resume loaded)
        self.held = False

    @contextmanager
    def updating(self, step: int) -> Iterator[None]:
        """The local update of ``step``: once it returns, the state is the state after ``step``.
        Blocks for good once the gate is held (the process is only serving now)."""
        with self._lock:
            try:
                yield
            except BaseException:
                self.completed = 0  # part of an update landed: the state is no step's, never a source
                raise
            self.completed = step

    def resumed(self, step: int) -> None:
        """The state was loaded as it was after ``step`` (a checkpoint's or a peer's)."""
        with self._lock:
            self.completed = step

    def hold(self) -> int:
        """No update from now on (waits for one in progress); the step the state stays at. Idempotent."""
        with self._holding:
            if not self.held:
                self._lock.acquire()
                self.held = True
        return self.completed
