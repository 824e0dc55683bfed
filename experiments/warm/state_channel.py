"""A held survivor's state, served to the ranks of the spare set that takes the run over (warm
TensorFlow and Chainer: no rollback to the checkpoint while a survivor holds the state).

The server runs in every member of a warm set from its start (its port told in the hello). It
serves only once the member's state is held (``StateGate.hold``: no update runs after it). Both
ends prove the job's secret (an HMAC, as the coordinator's channel: experiments/warm/protocol.py):
the taker answers the server's nonce, bound to the port its plan named (a relay on another port
cannot pass it on); the server's header answers the taker's nonce, over the header itself (the
step, each array's name, dtype and shape, the payload's sha256), so nothing is allocated before the
source is proven. Each message is a JSON object after its length (4 bytes, big-endian), then the
arrays' bytes; no pickle: the taker rebuilds the arrays with NumPy alone and checks the digest and
the step it was promised. A stranger's connections are bounded (MAX_UNPROVEN at once, the oldest
shut for a newer one; HELLO_TIMEOUT_S for the whole handshake), and an accept that fails waits and
goes on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from experiments.warm.protocol import HELLO_TIMEOUT_S, Unproven, accepted, new_nonce, shut

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 4 * 1024 * 1024  # names, dtypes and shapes of every array: well under this
MAX_REQUEST_BYTES = 1024
SEND_TIMEOUT_S = 120.0  # a taker that stops reading for this long is dropped
FETCH_CONNECT_S = 10.0
FETCH_READ_S = 120.0  # no byte for this long: the source is gone (or hung); keepalive sees a dead node sooner
CHUNK = 4 * 1024 * 1024
MAX_UNPROVEN = 8  # handshakes under way at once; a newer one shuts the oldest
WARNINGS_LOGGED = 5  # a stranger's flood is not a flood of log lines
ARRAY_KINDS = "biuf"  # bool, integers, floats: nothing else is state

Arrays = dict[str, np.ndarray]
StateSource = Callable[[], "tuple[int, Arrays]"]  # the held state: its step, its arrays


class StateNotTaken(RuntimeError):
    """The survivor's state could not be taken (refused, cut off, damaged, unproven, or of another step)."""


def taker_proof(secret: str, nonce: str, port: int, taker_nonce: str) -> str:
    """The taker's answer to the server's ``nonce``, for the source its plan named (``port``)."""
    return hmac.new(bytes.fromhex(secret), f"state {nonce} {port} {taker_nonce}".encode(), hashlib.sha256).hexdigest()


def server_proof(secret: str, taker_nonce: str, header: dict[str, Any]) -> str:
    """The server's answer to the taker's nonce, over the header it sends (without this field)."""
    body = json.dumps({key: value for key, value in header.items() if key != "proof"}, sort_keys=True)
    return hmac.new(bytes.fromhex(secret), f"served {taker_nonce} {body}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Packed:
    header: dict[str, Any]  # the step, the arrays (name, dtype, shape, bytes), the payload's sha256
    payload: list[memoryview]


def pack(step: int, arrays: Arrays) -> Packed:
    """The header and the arrays' bytes (C order, as they are: no copy beyond contiguity)."""
    digest = hashlib.sha256()
    entries, payload = [], []
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        array = array if array.flags.c_contiguous else array.copy(order="C")  # ascontiguousarray makes 0-d 1-d
        view = memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy 1.x stubs: no Buffer
        digest.update(view)
        payload.append(view)
        entries.append([name, array.dtype.str, list(array.shape), array.nbytes])
    return Packed({"step": step, "arrays": entries, "sha256": digest.hexdigest()}, payload)


def _listener() -> socket.socket:
    """Every interface (the node's name may not resolve to one of its own, or resolve to loopback),
    IPv6 too where the host has it: the handshake, not the address, keeps strangers out."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


class StateServer:
    """Listens beside a warm member; serves ``source()`` once ``held()`` says the state is frozen."""

    def __init__(self, secret: str, source: StateSource, held: Callable[[], bool]) -> None:
        self.secret, self.source, self.held = secret, source, held
        self.listener = _listener()
        self.port = int(self.listener.getsockname()[1])
        self._packed: Packed | None = None
        self._packing = threading.Lock()
        self._unproven = Unproven(MAX_UNPROVEN)
        self._warnings = 0
        threading.Thread(target=self._accept, name="warm-state", daemon=True).start()

    def close(self) -> None:
        shut(self.listener)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            connection = accepted(self.listener, lambda error: self._warn(f"accepting a connection failed ({error})"))
            if connection is None:
                return  # closed: the process is ending
            self._unproven.admit(connection)
            threading.Thread(target=self._serve, args=(connection,), name="warm-state-taker", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            deadline = threading.Timer(HELLO_TIMEOUT_S, shut, args=(connection,))  # the whole handshake
            deadline.start()
            try:
                taker_nonce = self._handshake(connection)
            except (OSError, StateNotTaken) as error:
                self._warn(f"a state request refused: {error}")
                return
            finally:
                deadline.cancel()
                self._unproven.settled(connection)
            try:
                packed = self._pack()
                header = {**packed.header, "proof": ""}
                header["proof"] = server_proof(self.secret, taker_nonce, header)
                connection.settimeout(SEND_TIMEOUT_S)
                connection.sendall(_framed(header))
                for view in packed.payload:
                    connection.sendall(view)
            except (OSError, ValueError, StateNotTaken) as error:
                self._warn(f"serving the state failed: {error}")

    def _handshake(self, connection: socket.socket) -> str:
        """The taker's nonce, once it proved the secret for this port; StateNotTaken (refused) otherwise."""
        connection.settimeout(HELLO_TIMEOUT_S)
        nonce = new_nonce()
        connection.sendall(_framed({"op": "challenge", "nonce": nonce}))
        request = _read_json(connection, MAX_REQUEST_BYTES)
        taker_nonce = str(request.get("nonce", ""))
        expected = taker_proof(self.secret, nonce, self.port, taker_nonce)
        if not taker_nonce or not hmac.compare_digest(expected.encode(), str(request.get("proof", "")).encode(errors="replace")):
            _refuse(connection, "the request does not prove the job's secret")
            raise StateNotTaken("no proof of the job's secret")
        if not self.held():
            _refuse(connection, "this member's state is not held (it may still change)")
            raise StateNotTaken("asked before the state was held")
        return taker_nonce

    def _pack(self) -> Packed:
        """Once: the state is held, every taker gets the same bytes."""
        with self._packing:
            if self._packed is None:
                self._packed = pack(*self.source())
            return self._packed

    def _warn(self, what: str) -> None:
        self._warnings += 1
        if self._warnings <= WARNINGS_LOGGED:
            log.warning("warm state channel: %s", what)


def fetch_state(address: str, port: int, secret: str, step: int) -> Arrays:
    """The arrays a held survivor serves at ``address:port``, checked: the server proved the job's
    secret over its header, the step is ``step``, the bytes are those the header's digest names.
    StateNotTaken otherwise."""
    try:
        with socket.create_connection((address, port), timeout=FETCH_CONNECT_S) as connection:
            connection.settimeout(FETCH_READ_S)
            _keepalive(connection)
            challenge = _read_json(connection, MAX_REQUEST_BYTES)
            taker_nonce = new_nonce()
            proof = taker_proof(secret, str(challenge.get("nonce", "")), port, taker_nonce)
            connection.sendall(_framed({"op": "fetch", "proof": proof, "nonce": taker_nonce, "step": step}))
            header = _read_json(connection, MAX_HEADER_BYTES)
            if "why" in header and "proof" not in header:
                raise StateNotTaken(f"the survivor at {address}:{port} refused: {str(header['why'])[:200]}")
            claimed = str(header.get("proof", ""))
            if not hmac.compare_digest(server_proof(secret, taker_nonce, header).encode(), claimed.encode(errors="replace")):
                raise StateNotTaken(f"{address}:{port} does not prove the job's secret: not the survivor the plan named")
            return _unpack(connection, header, step)
    except OSError as error:
        raise StateNotTaken(f"the survivor at {address}:{port}: {error}") from error


def _unpack(connection: socket.socket, header: dict[str, Any], step: int) -> Arrays:
    if header.get("step") != step:
        raise StateNotTaken(f"the survivor holds step {header.get('step')!r}, the plan named {step}")
    digest, arrays = hashlib.sha256(), {}
    for name, dtype_text, shape, nbytes in _entries(header):
        buffer = bytearray(nbytes)
        _read_into(connection, memoryview(buffer))
        digest.update(buffer)
        arrays[name] = np.frombuffer(buffer, dtype=np.dtype(dtype_text)).reshape(shape)
    if digest.hexdigest() != header.get("sha256"):
        raise StateNotTaken("the state's bytes do not match its digest")
    return arrays


def _entries(header: dict[str, Any]) -> list[tuple[str, str, list[int], int]]:
    """The header's arrays, each checked: a plain numeric dtype, a shape whose size is its bytes."""
    checked = []
    try:
        for name, dtype_text, shape, nbytes in header["arrays"]:
            dtype = np.dtype(str(dtype_text))
            dims = [int(dim) for dim in shape]
            if dtype.kind not in ARRAY_KINDS or any(dim < 0 for dim in dims) or \
                    int(nbytes) != math.prod(dims) * dtype.itemsize:
                raise StateNotTaken(f"array {name!r}: {dtype_text} {shape} is not {nbytes} bytes of numbers")
            checked.append((str(name), str(dtype_text), dims, int(nbytes)))
    except (KeyError, TypeError, ValueError) as error:
        raise StateNotTaken(f"a malformed header: {error}") from error
    return checked


def _read_into(connection: socket.socket, view: memoryview) -> None:
    while view:
        got = connection.recv_into(view[:CHUNK])
        if got == 0:
            raise StateNotTaken("the connection ended before the message did")
        view = view[got:]


def _framed(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, sort_keys=True).encode()
    return struct.pack(">I", len(body)) + body


def _read_json(connection: socket.socket, limit: int) -> dict[str, Any]:
    """One framed JSON object of at most ``limit`` bytes."""
    size = bytearray(4)
    _read_into(connection, memoryview(size))
    (length,) = struct.unpack(">I", size)
    if length > limit:
        raise StateNotTaken(f"a message of {length} bytes (at most {limit})")
    body = bytearray(length)
    _read_into(connection, memoryview(body))
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise StateNotTaken(f"not JSON: {type(error).__name__}") from None
    if not isinstance(message, dict):
        raise StateNotTaken(f"not a JSON object: {bytes(body[:80])!r}")
    return message


def _refuse(connection: socket.socket, why: str) -> None:
    connection.sendall(_framed({"why": why}))


def _keepalive(connection: socket.socket) -> None:
    """A source whose node died without a word ends the taker's wait within seconds, not FETCH_READ_S."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
