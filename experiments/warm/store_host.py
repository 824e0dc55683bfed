"""The rendezvous stores of a warm PyTorch job's generations, hosted by its coordinator.

A generation's ranks meet at a key-value store (c10d's TCPStore). Hosted by the generation's rank
0, as a plain start hosts it, the store dies with that rank: a kill that lands on rank 0 while a
re-formation forms leaves every other member connecting to, or waiting on, a store that is gone,
until its join times out (15 s, measured: each such kill cost a re-formation that long; in the full
run one job re-formed every 10 s for 10 minutes). Here the coordinator hosts each generation's
store, as torchelastic's agent hosts its workers' rendezvous: it outlives every rank, and when a
generation fails before it formed the coordinator closes its store, which ends the waits of the
members still in its rendezvous at once (their join raises: they report lost, the next plan comes).

Only the peer mode (PyTorch) uses it: the coordinator imports torch's store here, nothing else of
a framework. A store listens on every interface at a port the system chooses (no clash with
another job's); ``address`` is the name the members reach the coordinator by.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

# How long a member's store operations may wait at most (its join's own timeout is shorter).
STORE_TIMEOUT = timedelta(minutes=10)


class StoreHost:
    def __init__(self, address: str) -> None:
        self.address = address
        self._stores: dict[int, Any] = {}  # generation -> its TCPStore (this process is its server)
        self._lock = threading.Lock()

    def open(self, generation: int) -> int:
        """The port of ``generation``'s store, started here on first use."""
        with self._lock:
            store = self._stores.get(generation)
            if store is None:
                from torch.distributed import TCPStore  # the coordinator's only framework import

                store = TCPStore(self.address, 0, None, True, STORE_TIMEOUT, wait_for_workers=False)
                self._stores[generation] = store
            return int(store.port)

    def close(self, generation: int) -> None:
        """End ``generation``'s store: a member still waiting on it raises at once."""
        with self._lock:
            self._stores.pop(generation, None)  # its server stops with the last reference

    def close_before(self, generation: int) -> None:
        """End the stores of the generations before ``generation`` (no member is in them any more)."""
        with self._lock:
            for earlier in [g for g in self._stores if g < generation]:
                del self._stores[earlier]

    def close_all(self) -> None:
        with self._lock:
            self._stores.clear()
