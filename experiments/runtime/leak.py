"""A memory leak on request, for the ``oom-rank`` fault: the fault agent caps the rank's memory (a
memory cgroup of its own) and sends ``LEAK_SIGNAL``; from then on a thread of the rank allocates
and touches memory, as a leak or a batch too big for the node does, until the kernel's OOM killer
ends the rank. Without the signal nothing happens, and the leak stops at ``LEAK_LIMIT_BYTES`` (a
rank whose cap failed to take holds that much, and the fault is refused)."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

LEAK_SIGNAL = signal.SIGURG  # ignored by default: a process without this handler is not harmed
CHUNK_BYTES = 16 << 20
CHUNK_EVERY_S = 0.02  # ~800 MB/s: a cap of tens of MB is reached within a step or two
LEAK_LIMIT_BYTES = 1 << 30
PAGE_BYTES = 4096


@dataclass
class MemoryLeak:
    held: list[bytearray] = field(default_factory=list)
    started_at: float | None = None

    def install(self) -> "MemoryLeak":
        signal.signal(LEAK_SIGNAL, self._start)
        return self

    def _start(self, signum: int, frame: FrameType | None) -> None:
        if self.started_at is None:
            self.started_at = time.time()
            threading.Thread(target=self._grow, name="faultdrill-leak", daemon=True).start()

    def _grow(self) -> None:
        while len(self.held) * CHUNK_BYTES < LEAK_LIMIT_BYTES:
            chunk = bytearray(CHUNK_BYTES)
            chunk[::PAGE_BYTES] = b"\x01" * len(range(0, CHUNK_BYTES, PAGE_BYTES))  # every page charged
            self.held.append(chunk)
            time.sleep(CHUNK_EVERY_S)
