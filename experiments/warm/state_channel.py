"""A held survivor's state, served to the ranks of the spare set that takes the run over (warm
TensorFlow and Chainer: no rollback to the checkpoint while a survivor holds the state).

The server runs in every member of a warm set from its start (its port told in the hello). It
serves only once the member's state is held (``StateGate.hold``: no update runs after it), and
only to a connection that answers its challenge with the job's secret (an HMAC, as the
coordinator's channel: experiments/warm/protocol.py). Each message is a JSON object after its
length (4 bytes, big-endian); the state is a header (the step, each array's name, dtype and shape,
the payload's sha256), then the arrays' bytes. No pickle: the
taker rebuilds the arrays with NumPy alone, checks the digest and the step it was promised.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from experiments.warm.protocol import HELLO_TIMEOUT_S, new_nonce

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 4 * 1024 * 1024  # names, dtypes and shapes of every array: well under this
SEND_TIMEOUT_S = 120.0  # a taker that stops reading for this long is dropped
FETCH_CONNECT_S = 10.0
FETCH_READ_S = 120.0  # no byte for this long: the source is gone (or hung)
CHUNK = 4 * 1024 * 1024

Arrays = dict[str, np.ndarray]
StateSource = Callable[[], "tuple[int, Arrays]"]  # the held state: its step, its arrays


class StateNotTaken(RuntimeError):
    """The survivor's state could not be taken (refused, cut off, damaged, or of another step)."""


def state_proof(secret: str, nonce: str) -> str:
    return hmac.new(bytes.fromhex(secret), f"state {nonce}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Packed:
    header: bytes  # one framed JSON object
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
    header = {"step": step, "arrays": entries, "sha256": digest.hexdigest()}
    return Packed(_framed(header), payload)


class StateServer:
    """Listens beside a warm member; serves ``source()`` once ``held()`` says the state is frozen."""

    def __init__(self, address: str, secret: str, source: StateSource, held: Callable[[], bool]) -> None:
        self.secret, self.source, self.held = secret, source, held
        self.listener = socket.create_server((address, 0))
        self.port = int(self.listener.getsockname()[1])
        self._packed: Packed | None = None
        self._packing = threading.Lock()
        threading.Thread(target=self._accept, name="warm-state", daemon=True).start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed: the process is ending
            threading.Thread(target=self._serve, args=(connection,), name="warm-state-taker", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.settimeout(HELLO_TIMEOUT_S)
                nonce = new_nonce()
                connection.sendall(_framed({"op": "challenge", "nonce": nonce}))
                request = _read_json(connection, 1024)
                claimed = str(request.get("proof", ""))
                if not hmac.compare_digest(state_proof(self.secret, nonce).encode(), claimed.encode(errors="replace")):
                    _refuse(connection, "the request does not prove the job's secret")
                    return
                if not self.held():
                    _refuse(connection, "this member's state is not held (it may still change)")
                    return
                packed = self._pack()
                connection.settimeout(SEND_TIMEOUT_S)
                connection.sendall(packed.header)
                for view in packed.payload:
                    connection.sendall(view)
            except (OSError, ValueError, StateNotTaken) as error:
                log.warning("warm: serving the state failed: %s", error)

    def _pack(self) -> Packed:
        """Once: the state is held, every taker gets the same bytes."""
        with self._packing:
            if self._packed is None:
                self._packed = pack(*self.source())
            return self._packed


def fetch_state(address: str, port: int, secret: str, step: int) -> Arrays:
    """The arrays a held survivor serves at ``address:port``, checked: its step is ``step``, its
    bytes are those its header's digest names. StateNotTaken otherwise."""
    try:
        with socket.create_connection((address, port), timeout=FETCH_CONNECT_S) as connection:
            connection.settimeout(FETCH_READ_S)
            challenge = _read_json(connection, 1024)
            proof = state_proof(secret, str(challenge.get("nonce", "")))
            connection.sendall(_framed({"op": "fetch", "proof": proof, "step": step}))
            header = _read_json(connection, MAX_HEADER_BYTES)
            if "why" in header:
                raise StateNotTaken(f"the survivor at {address}:{port} refused: {header['why']}")
            return _unpack(connection, header, step)
    except OSError as error:
        raise StateNotTaken(f"the survivor at {address}:{port}: {error}") from error


def _unpack(connection: socket.socket, header: dict, step: int) -> Arrays:
    if header.get("step") != step:
        raise StateNotTaken(f"the survivor holds step {header.get('step')!r}, the plan named {step}")
    digest, arrays = hashlib.sha256(), {}
    for name, dtype, shape, nbytes in header["arrays"]:
        buffer = bytearray(nbytes)
        _read_into(connection, memoryview(buffer))
        digest.update(buffer)
        arrays[str(name)] = np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)
    if digest.hexdigest() != header.get("sha256"):
        raise StateNotTaken("the state's bytes do not match its digest")
    return arrays


def _read_into(connection: socket.socket, view: memoryview) -> None:
    while view:
        got = connection.recv_into(view[:CHUNK])
        if got == 0:
            raise StateNotTaken("the survivor's connection ended before its state did")
        view = view[got:]


def _framed(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def _read_json(connection: socket.socket, limit: int) -> dict:
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
    except ValueError as error:
        raise StateNotTaken(f"not JSON: {error}") from error
    if not isinstance(message, dict):
        raise StateNotTaken(f"not a JSON object: {bytes(body[:80])!r}")
    return message


def _refuse(connection: socket.socket, why: str) -> None:
    connection.sendall(_framed({"why": why}))
