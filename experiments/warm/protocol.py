"""The warm strategy's vocabulary: what the coordinator and the members of a job say to each other.

One TCP connection per member process, open for the process's whole life: its end (the kernel
closes it when the process dies, SIGKILL included) is how the coordinator learns of a death, at
once. Messages are JSON objects, one per line.

The channel is the job's own: the coordinator opens each connection with a ``challenge`` (a fresh
nonce), and a member's ``hello`` carries an HMAC of it under the job's secret (ENV_WARM_SECRET, in
the environment of the processes the job launched, which only the user and root can read). A
connection without that proof, for a slot the job did not launch or one already held, is turned
away; a line longer than MAX_LINE_CHARS or not a JSON object ends its connection.

member -> coordinator: ``hello`` (slot, node, address, pid, proof, and a set member's state port:
the member is warm: framework imported, model built), ``formed`` (its group of that generation is
up and its state in sync), ``lost`` (a collective of that generation failed; the last step it
completed), ``held`` (a set member's state is frozen at that step and served), ``done`` (the run
reached its last step on this member).
coordinator -> member: ``plan`` (its rank in a new generation: world size, rendezvous, where the
state comes from), ``hold`` (a set member: stop updating, serve the state), ``exit`` (the run is
over; a spare leaves).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

MAX_LINE_CHARS = 16 * 1024  # a plan or a hello is well under 1 KB
HELLO_TIMEOUT_S = 10.0  # a connection's hello must come this soon after its challenge

RESTART_ALL_FRAMEWORKS = ("tensorflow", "chainer")
SET_PORT_OFFSET = 64  # restart-all: set n's ports start here above the job's port base, world_size each


def set_port(port_base: int, number: int, world_size: int) -> int:
    """The first port of spare set ``number``'s block (its ranks take the ones above it)."""
    return port_base + SET_PORT_OFFSET + number * world_size

RESUME_START = "start"  # generation 0: a cold start (or the newest valid checkpoint of an earlier attempt)
RESUME_PEER = "peer"  # a survivor's state, broadcast to the others: no rollback
RESUME_CHECKPOINT = "checkpoint"  # no survivor holds the state: the newest valid checkpoint


@dataclass(frozen=True)
class Plan:
    """One member's part in a generation of the job's process group."""

    generation: int
    attempt: int  # the run's attempt this generation is (the job's first attempt + its generation)
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    resume: str  # RESUME_*
    source_rank: int | None  # RESUME_PEER: the rank whose state everyone takes
    step: int  # RESUME_PEER: the step that state holds
    planned_at: float  # when the coordinator sent it (the recovery's "accepted" moment)
    # A re-formed group's rendezvous gives up after this (its members are all warm: seconds do); a
    # member that died meanwhile voids the generation: the others report lost and a new plan comes.
    join_timeout_s: float | None = None
    store_hosted: bool = False  # the coordinator hosts the rendezvous store (rank 0 does not)
    # RESUME_PEER in a restart-all set (TensorFlow, Chainer): where the held survivor serves its
    # state (experiments/warm/state_channel.py); PyTorch's survivors broadcast it in the new group.
    source_address: str = ""
    source_port: int = 0

    def message(self) -> dict[str, Any]:
        return {"op": "plan", **asdict(self)}

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> "Plan":
        return cls(**{key: value for key, value in message.items() if key not in ("op", "proof")})


class MalformedMessage(RuntimeError):
    """A line too long, or not a JSON object: the connection is not (or no longer) a member's."""


def new_secret() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(secret: str, nonce: str, slot: int, pid: int) -> str:
    """What a member's hello proves: it holds the job's secret, answering this connection's nonce."""
    return hmac.new(bytes.fromhex(secret), f"{nonce} {slot} {pid}".encode(), hashlib.sha256).hexdigest()


def coordinator_proof(secret: str, member_nonce: str, slot: int) -> str:
    """What the coordinator's plans prove to a member: it holds the job's secret, answering the
    nonce of this member's hello (a stranger on a freed port cannot plan a spare)."""
    return hmac.new(bytes.fromhex(secret), f"coordinator {member_nonce} {slot}".encode(), hashlib.sha256).hexdigest()


def coordinator_proven(secret: str, member_nonce: str, slot: int, claimed: str) -> bool:
    return hmac.compare_digest(coordinator_proof(secret, member_nonce, slot).encode(),
                               claimed.encode(errors="replace"))


def proven(secret: str, nonce: str, slot: int, pid: int, claimed: str) -> bool:
    # As bytes: compare_digest refuses a str that is not ASCII (a stranger's proof may be anything).
    return hmac.compare_digest(proof(secret, nonce, slot, pid).encode(), claimed.encode(errors="replace"))


class Line:
    """JSON lines over one socket (either end)."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self._reader = connection.makefile("r", encoding="utf-8", newline="\n")

    def send(self, message: dict[str, Any]) -> None:
        self.connection.sendall((json.dumps(message) + "\n").encode())

    def receive(self) -> dict[str, Any] | None:
        """The next message; None once the other end is gone (or silent past the socket's timeout).
        MalformedMessage for a line over MAX_LINE_CHARS or one that is not a JSON object."""
        try:
            text = self._reader.readline(MAX_LINE_CHARS + 1)
        except (OSError, ValueError):
            return None
        if not text:
            return None
        if len(text) > MAX_LINE_CHARS or not text.endswith("\n"):
            raise MalformedMessage(f"a line of more than {MAX_LINE_CHARS} characters")
        try:
            message = json.loads(text)
        except ValueError as error:
            raise MalformedMessage(f"not JSON: {error}") from error
        except RecursionError:
            raise MalformedMessage("JSON nested too deep") from None
        if not isinstance(message, dict):
            raise MalformedMessage(f"not a JSON object: {text[:80]!r}")
        return message

    def close(self) -> None:
        """The connection ended both ways at once: a thread blocked reading it (the member's wait for
        the coordinator's word) returns now, not at its read timeout (closing the reader first
        waited for that read to end: 20 s)."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more
        try:
            self._reader.close()
            self.connection.close()
        except OSError:
            pass


ACCEPT_RETRY_S = 0.2


def accepted(listener: socket.socket, warn: Callable[[OSError], None]) -> socket.socket | None:
    """The listener's next connection; None once it is closed. An accept that fails (descriptors
    out: a flood) is told to ``warn``, waits ACCEPT_RETRY_S and goes on: they come back as the
    flood's connections end."""
    while True:
        try:
            return listener.accept()[0]
        except OSError as error:
            if listener.fileno() < 0 or error.errno in (errno.EBADF, errno.EINVAL):
                return None
            warn(error)
            time.sleep(ACCEPT_RETRY_S)


class Unproven:
    """Connections that have not proven the job's secret yet, at most ``limit``: a newer one takes
    the oldest's place (shut: its reader finds nothing), so a stranger who holds them all cannot
    keep a member out, and a flood cannot take the threads and descriptors."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._connections: list[socket.socket] = []  # oldest first
        self._guard = threading.Lock()

    def admit(self, connection: socket.socket) -> None:
        with self._guard:
            oldest = self._connections.pop(0) if len(self._connections) >= self.limit else None
            self._connections.append(connection)
        if oldest is not None:
            shut(oldest)

    def __len__(self) -> int:
        return len(self._connections)

    def settled(self, connection: socket.socket) -> None:
        """Proven, refused or gone: no longer counted."""
        with self._guard:
            if connection in self._connections:
                self._connections.remove(connection)


def shut(connection: socket.socket) -> None:
    """End a connection from another thread: its reader wakes with nothing to read."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
