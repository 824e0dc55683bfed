"""A member's line to the job's warm coordinator (experiments/warm/coordinator.py).

Opened once the process is warm (framework imported, model built) and held until it exits: the
connection's end is the coordinator's news of this process's death.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable

from experiments.layout import ENV_WARM_SECRET
from experiments.warm.protocol import (
    HELLO_TIMEOUT_S,
    Line,
    MalformedMessage,
    Plan,
    coordinator_proven,
    new_nonce,
    proof,
)

CONNECT_RETRY_S = 0.05
TURNED_AWAY_RETRY_S = 0.05


# The start of a failed collective's message that a lost report carries (the coordinator tells it on).
LOST_WHY_CHARS = 300


class CoordinatorGone(RuntimeError):
    """The coordinator's connection ended: the job is ending (or its coordinator died)."""


class WarmMember:
    def __init__(self, coordinator: str, slot: int, node: str, address: str, connect_timeout_s: float = 120.0,
                 secret: str | None = None, state_port: int = 0) -> None:
        """Connect, answer the coordinator's challenge with the job's secret (``secret``, else
        ENV_WARM_SECRET), say hello (``state_port``: where this set member serves its held state)."""
        self.slot = slot
        self._sending = threading.Lock()  # the training thread and the hold listener both send
        self.released = threading.Event()  # the coordinator's connection ended (hold listener)
        self.line, challenge = _challenged(coordinator, slot, connect_timeout_s)
        self.line.connection.settimeout(None)
        self.key = secret if secret is not None else os.environ.get(ENV_WARM_SECRET, "")
        self.nonce = new_nonce()  # the coordinator's plans must answer it: it holds the secret too
        pid = os.getpid()
        self.line.send({"op": "hello", "slot": slot, "node": node, "address": address, "pid": pid,
                        "nonce": self.nonce, "state_port": state_port,
                        "proof": proof(self.key, str(challenge.get("nonce", "")), slot, pid) if self.key else ""})

    def next_plan(self) -> Plan | None:
        """This member's next part (blocks: a spare waits here); None when the run is over."""
        try:
            message = self.line.receive()
        except MalformedMessage as error:
            raise CoordinatorGone(f"warm: slot {self.slot}: {error}") from error
        if message is None:
            raise CoordinatorGone(f"warm: slot {self.slot}: the coordinator's connection ended")
        if message.get("op") == "exit":
            return None
        if message.get("op") != "plan":
            raise CoordinatorGone(f"warm: slot {self.slot}: unexpected message {message!r}")
        if self.key and not coordinator_proven(self.key, self.nonce, self.slot, str(message.get("proof", ""))):
            raise CoordinatorGone(f"warm: slot {self.slot}: a plan that does not prove the job's secret "
                                  "(not this job's coordinator): ignored, this process ends")
        return Plan.from_message(message)

    def formed(self, generation: int, **timings: float) -> None:
        self._send({"op": "formed", "generation": generation, **timings})

    def lost(self, generation: int, step: int, why: str = "", source_failed: bool = False) -> None:
        """A collective (or the rendezvous) of ``generation`` failed, ``why`` in its own words;
        ``step``: the last step this member completed; ``source_failed``: the state its plan named
        could not be taken from that source (a set member)."""
        self._send({"op": "lost", "generation": generation, "step": step, "why": why[:LOST_WHY_CHARS],
                    "source_failed": source_failed})

    def warned(self, generation: int, step: int) -> None:
        """This rank saved ``step`` on the scheduler's warning and holds until the job ends."""
        self._send({"op": "warned", "generation": generation, "step": step})

    def done(self) -> None:
        self._send({"op": "done"})

    def answer_holds(self, hold: Callable[[], int]) -> None:
        """From now on (a set member that was planned), the coordinator's ``hold`` is answered on a
        thread of its own: ``hold()`` freezes the state, its step goes back as ``held``. The
        connection's end sets ``released``."""
        threading.Thread(target=self._holds, args=(hold,), name="warm-holds", daemon=True).start()

    def _holds(self, hold: Callable[[], int]) -> None:
        try:
            while (message := self.line.receive()) is not None:
                if message.get("op") == "hold":
                    self._send({"op": "held", "step": hold()})
        except (MalformedMessage, CoordinatorGone):
            pass
        finally:
            self.released.set()

    def _send(self, message: dict[str, Any]) -> None:
        try:
            with self._sending:
                self.line.send(message)
        except OSError as error:
            raise CoordinatorGone(f"warm: slot {self.slot}: the coordinator is gone ({error})") from error


def _challenged(coordinator: str, slot: int, timeout_s: float) -> tuple[Line, dict[str, Any]]:
    """A connection to the coordinator and its challenge. A connection that ends before its challenge
    was turned away (its unproven connections were full: a stranger's flood) and is made again,
    until ``timeout_s``."""
    host, port = coordinator.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        line = Line(_connect(host, int(port), max(deadline - time.monotonic(), 0.0)))
        line.connection.settimeout(HELLO_TIMEOUT_S)
        try:
            challenge = line.receive()
        except MalformedMessage as error:
            line.close()
            raise CoordinatorGone(f"warm: slot {slot}: the coordinator's challenge: {error}") from error
        if challenge is not None and challenge.get("op") == "challenge":
            return line, challenge
        line.close()
        if challenge is not None or time.monotonic() > deadline:
            raise CoordinatorGone(f"warm: slot {slot}: no challenge from the coordinator at {coordinator}")
        time.sleep(TURNED_AWAY_RETRY_S)


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """The coordinator may start a moment after its members (Slurm: the batch script starts both)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connection = socket.create_connection((host, port), timeout=10)
            connection.settimeout(None)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return connection
        except OSError as error:
            if time.monotonic() > deadline:
                raise CoordinatorGone(f"warm: no coordinator at {host}:{port} after {timeout_s:g} s: {error}") from error
            time.sleep(CONNECT_RETRY_S)
