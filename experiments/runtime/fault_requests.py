"""Faults a rank acts out itself, at the fault agent's request: grow its memory (``oom-rank``: a
leak, under the memory cap the agent set) or raise an exception in its training loop
(``rank-error``: a bug, a NaN guard, a device error). The agent writes what it asks into the
rank's request file (next to its identity file), then sends ``FAULT_SIGNAL``; the rank reads and
removes the file. SIGURG is ignored by default, so a process without this handler (a script that
does not use Faultdrill's runtime) is not harmed, and the agent says it did not act."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

FAULT_SIGNAL = signal.SIGURG
ACTION_LEAK = "leak"
ACTION_RAISE = "raise"
ACTIONS = (ACTION_LEAK, ACTION_RAISE)
CHUNK_BYTES = 16 << 20
CHUNK_EVERY_S = 0.02  # ~800 MB/s: a cap of tens of MB is reached within a step or two
LEAK_LIMIT_BYTES = 1 << 30  # a rank whose cap did not take holds at most this much (unless asked for more)
LEAK_MOST_BYTES = (65536 + 1024) << 20  # what a request may ask the rank to hold, at most (oom-rank's most)
LEAK_BYTES_PER_S = CHUNK_BYTES / CHUNK_EVERY_S  # how fast the leak grows, at most
PAGE_BYTES = 4096


class InjectedRankError(RuntimeError):
    """The exception the rank-error fault makes the training loop raise."""


def leak_bound(most_bytes: int | None) -> int:
    """What the leak holds at most: as asked (a positive number, at most LEAK_MOST_BYTES), else
    LEAK_LIMIT_BYTES (the agent's own cap ends it long before)."""
    if most_bytes is None or most_bytes <= 0:
        return LEAK_LIMIT_BYTES
    return min(most_bytes, LEAK_MOST_BYTES)


@dataclass
class MemoryLeak:
    held: list[bytearray] = field(default_factory=list)
    started_at: float | None = None
    most_bytes: int = LEAK_LIMIT_BYTES

    def start(self, most_bytes: int | None = None) -> None:
        """Grow until ``most_bytes`` are held (the agent's request says how far: past the job's memory
        limit when the scheduler's cgroup is the cap; LEAK_LIMIT_BYTES when the agent's own is)."""
        if self.started_at is None:
            self.most_bytes = leak_bound(most_bytes)
            self.started_at = time.time()
            threading.Thread(target=self._grow, name="faultdrill-leak", daemon=True).start()

    def _grow(self) -> None:
        while len(self.held) * CHUNK_BYTES < self.most_bytes:
            chunk = bytearray(CHUNK_BYTES)
            chunk[::PAGE_BYTES] = b"\x01" * len(range(0, CHUNK_BYTES, PAGE_BYTES))  # every page charged
            self.held.append(chunk)
            time.sleep(CHUNK_EVERY_S)


@dataclass
class FaultRequests:
    """This rank's handler of the agent's requests (installed before the rank registers)."""

    request_file: Path
    leak: MemoryLeak = field(default_factory=MemoryLeak)

    def install(self) -> "FaultRequests":
        signal.signal(FAULT_SIGNAL, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        request = _take(self.request_file)
        if request is None:
            return
        if request.get("action") == ACTION_LEAK:
            most = request.get("most_bytes")
            self.leak.start(most if isinstance(most, int) and not isinstance(most, bool) else None)
        elif request.get("action") == ACTION_RAISE:
            raise InjectedRankError(str(request.get("message") or "raised in the training loop by the rank-error fault"))


def _take(path: Path) -> dict[str, Any] | None:
    try:
        request = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    return request if isinstance(request, dict) else None
