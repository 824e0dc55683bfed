"""The rendezvous stores of a warm PyTorch job's generations, hosted by its coordinator.

A generation's ranks meet at a key-value store (c10d's TCPStore). Hosted by the generation's rank
0, as a plain start hosts it, the store dies with that rank: a kill that lands on rank 0 while a
re-formation forms leaves every other member connecting to, or waiting on, a store that is gone,
until its join times out (15 s, measured: each such kill cost a re-formation that long; in the full
run one job re-formed every 10 s for 10 minutes). Here the coordinator hosts each generation's
store, as torchelastic's agent hosts its workers' rendezvous: it outlives every rank, and when a
generation fails the coordinator voids its store: every connection to it ends, so the members still
in its rendezvous stop waiting at once (their join raises: they report lost, the next plan comes),
and it answers its port afresh for a member that connects only then, ended again each second until
every survivor has reported.

Only the peer mode (PyTorch) uses it: the coordinator imports torch's store here, nothing else of
a framework. A store listens on every interface at a port the system chooses (no clash with
another job's); ``address`` is the name the members reach the coordinator by.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

# The coordinator's own connection to a store it serves (its address must answer at once: it is
# this host's); the members' waits have their own timeouts.
STORE_TIMEOUT = timedelta(seconds=30)
OWN_CLIENT_ADDRESS = "127.0.0.1"


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
                store = self._stores[generation] = self._start(0)
            return int(store.port)

    def _start(self, port: int) -> Any:
        """A store served here, at ``port`` (0: one the system chooses)."""
        from torch.distributed import TCPStore  # the coordinator's only framework import

        # Its server listens on every interface; its own client goes by loopback (no name to look up:
        # a lookup that went unanswered held every re-formation 5 s).
        return TCPStore(OWN_CLIENT_ADDRESS, port, None, True, STORE_TIMEOUT, wait_for_workers=False)

    def void(self, generation: int) -> None:
        """End every connection to ``generation``'s store (a member waiting on it raises at once) and
        answer its port afresh: a member that connects only now (its plan came, the kill came
        before its connection) finds a store to wait on, which the next ``void`` ends too, where
        a closed port would have left it retrying its connection for its whole timeout."""
        with self._lock:
            store = self._stores.pop(generation, None)
            if store is None:
                return
            port = int(store.port)
            del store  # its server stops with the last reference: its connections end
            try:
                self._stores[generation] = self._start(port)
            except Exception as error:  # the port taken meanwhile: a late member retries until its timeout
                log.warning("warm: generation %d's voided store could not answer port %d again: %s",
                            generation, port, error)

    def close_before(self, generation: int) -> None:
        """End the stores of the generations before ``generation`` (no member is in them any more)."""
        with self._lock:
            for earlier in [g for g in self._stores if g < generation]:
                del self._stores[earlier]

    def close_all(self) -> None:
        with self._lock:
            self._stores.clear()
