"""The warm state channel (a held survivor's state served to the next set's ranks) over loopback:
both ends prove the job's secret, the taker's proof bound to the port its plan named; only a held
state is served, of the step promised, its bytes as the header's digest says; a stranger's flood,
drip, junk or impostor server neither gets state nor keeps the real taker out."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from experiments.warm import state_channel
from experiments.warm.protocol import new_secret
from experiments.warm.state_channel import (
    MAX_UNPROVEN,
    StateNotTaken,
    StateServer,
    _entries,
    _framed,
    _read_json,
    fetch_state,
    pack,
    server_proof,
)

pytestmark = pytest.mark.unit

SECRET = new_secret()
STATE = {"weights": np.arange(12, dtype=np.float32).reshape(3, 4), "iterations": np.array(7, dtype=np.int64),
         "flags": np.array([True, False]), "columns": np.asfortranarray(np.ones((2, 3), dtype=np.float64))}


@pytest.fixture
def held_server() -> Any:
    held = threading.Event()
    held.set()
    server = StateServer(SECRET, lambda: (30, STATE), held=held.is_set)
    yield server
    server.close()


def test_a_held_state_is_taken_as_it_was_served(held_server: StateServer) -> None:
    taken = fetch_state("127.0.0.1", held_server.port, SECRET, 30)
    assert sorted(taken) == sorted(STATE)
    for name, array in STATE.items():
        assert taken[name].dtype == array.dtype and taken[name].shape == array.shape
        assert np.array_equal(taken[name], array)


def test_the_wrong_secret_or_the_wrong_step_takes_nothing(held_server: StateServer) -> None:
    with pytest.raises(StateNotTaken, match="secret"):
        fetch_state("127.0.0.1", held_server.port, new_secret(), 30)
    with pytest.raises(StateNotTaken, match="holds step 30, the plan named 31"):
        fetch_state("127.0.0.1", held_server.port, SECRET, 31)


def test_a_state_not_held_is_not_served() -> None:
    server = StateServer(SECRET, lambda: (30, STATE), held=lambda: False)
    try:
        with pytest.raises(StateNotTaken, match="not held"):
            fetch_state("127.0.0.1", server.port, SECRET, 30)
    finally:
        server.close()


def test_an_impostor_on_the_planned_port_is_not_believed() -> None:
    """A stranger on the port the plan names (the source died, its port reused) serves its own
    arrays with a digest of its own: it cannot answer the taker's nonce with the secret."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def impostor() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(_framed({"op": "challenge", "nonce": "00"}))
            _read_json(connection, 1024)
            packed = pack(30, {"weights": np.full(4, 666.0)})
            connection.sendall(_framed({**packed.header, "proof": "0" * 64}))
            for view in packed.payload:
                connection.sendall(view)

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(StateNotTaken, match="does not prove the job's secret"):
        fetch_state("127.0.0.1", port, SECRET, 30)
    listener.close()


def test_a_relay_on_another_port_cannot_pass_a_takers_proof_on(held_server: StateServer) -> None:
    """The taker's proof names the port its plan gave: the real server, on another port, refuses it."""
    listener = socket.create_server(("127.0.0.1", 0))
    relay_port = listener.getsockname()[1]

    def relay() -> None:
        taker, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", held_server.port))
        for source, target in ((upstream, taker), (taker, upstream)):
            threading.Thread(target=_pipe, args=(source, target), daemon=True).start()

    threading.Thread(target=relay, daemon=True).start()
    with pytest.raises(StateNotTaken, match="refused: the request does not prove"):
        fetch_state("127.0.0.1", relay_port, SECRET, 30)
    listener.close()


def test_a_flood_of_silent_connections_does_not_keep_the_taker_out(held_server: StateServer) -> None:
    strangers = [socket.create_connection(("127.0.0.1", held_server.port)) for _ in range(3 * MAX_UNPROVEN)]
    try:
        taken = fetch_state("127.0.0.1", held_server.port, SECRET, 30)
        assert np.array_equal(taken["weights"], STATE["weights"])
    finally:
        for stranger in strangers:
            stranger.close()


def test_a_handshake_dripped_a_byte_at_a_time_is_cut_off_at_the_handshakes_timeout(
        held_server: StateServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_channel, "HELLO_TIMEOUT_S", 0.5)
    stranger = socket.create_connection(("127.0.0.1", held_server.port))
    stranger.settimeout(5)
    started = time.monotonic()
    try:
        for byte in b"\x00\x00\x00\x40{\"op\": \"fetch\"":
            stranger.sendall(bytes([byte]))
            time.sleep(0.1)
            if time.monotonic() - started > 3:
                break
    except OSError:
        pass  # cut off: what the test wants
    with pytest.raises(OSError):  # the server shut it: nothing more arrives, sending fails or EOF
        while stranger.recv(4096):
            pass
        raise OSError("closed")
    assert time.monotonic() - started < 3, "the whole handshake is bounded, not each read"
    stranger.close()


def test_junk_requests_are_refused_without_harm(held_server: StateServer) -> None:
    for junk in (b"\xff\xff\xff\xff", _framed({"x": 1})[:4] + b"[" * 1020, b"\x00\x00\x00\x05hello"):
        with socket.create_connection(("127.0.0.1", held_server.port), timeout=5) as stranger:
            try:
                stranger.sendall(junk)
                stranger.shutdown(socket.SHUT_WR)
                while stranger.recv(4096):
                    pass
            except OSError:
                pass  # refused and closed (a reset, where the junk was left unread)
    assert np.array_equal(fetch_state("127.0.0.1", held_server.port, SECRET, 30)["weights"], STATE["weights"])


@pytest.mark.parametrize("entry", [["w", "<f4", [3], 13], ["w", "|O", [1], 8], ["w", "<f4", [-1], 4],
                                   ["w", "<f4", [1 << 40, 1 << 40], 4], ["w", "<f4"]])
def test_an_array_whose_size_or_type_is_not_numbers_of_its_shape_is_refused(entry: list[Any]) -> None:
    with pytest.raises(StateNotTaken):
        _entries({"arrays": [entry]})


def test_the_servers_proof_covers_its_header() -> None:
    header = pack(30, {"w": np.zeros(2)}).header
    proof = server_proof(SECRET, "ab", header)
    assert proof == server_proof(SECRET, "ab", {**header, "proof": proof})
    assert proof != server_proof(SECRET, "ab", {**header, "step": 31})


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
