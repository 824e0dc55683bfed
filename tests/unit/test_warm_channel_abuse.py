"""The warm coordinator's channel against a stranger who floods it or holds it (security issue 28,
item 1, after its review): the accept loop outlives a lack of descriptors, connections that have
not proven the secret are capped, a hello has one deadline in all (not one per read), and a
message the coordinator cannot use (a proof that is not ASCII, a `lost` without its step) ends
that connection, counted, never its thread alone."""

from __future__ import annotations

import errno
import socket
import time
from typing import Any

import pytest

from experiments.warm import coordinator as coordinator_module
from experiments.warm.protocol import Line
from warm_scenario import Host, start_coordinator, warm_member, within

pytestmark = pytest.mark.unit


def _connect(address: str) -> socket.socket:
    host_name, port = address.rsplit(":", 1)
    return socket.create_connection((host_name, int(port)), timeout=5)


class FlakyListener:
    """A listener whose first accept fails as one does when the process is out of descriptors."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener, self.failed = listener, False

    def accept(self) -> Any:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, "Too many open files")
        return self.listener.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.listener, name)


def test_an_accept_that_fails_for_want_of_descriptors_does_not_end_the_accept_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: after a flood exhausted the descriptors, accept() failed once and the loop returned
    for good: no spare or rank could ever join again."""
    real_server = socket.create_server

    def flaky_server(*args: Any, **kwargs: Any) -> Any:
        return FlakyListener(real_server(*args, **kwargs))

    monkeypatch.setattr(socket, "create_server", flaky_server)
    host = Host()
    _, address, outcome = start_coordinator(host, world=1, spares=0)
    monkeypatch.undo()
    rank0 = warm_member(address, 0)
    assert rank0.next_plan().rank == 0, "a member was admitted after the failed accept"
    rank0.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"


def test_a_flood_of_connections_that_prove_nothing_is_capped_and_a_member_still_joins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "MAX_UNPROVEN", 8)
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=1, spares=0)
    flood = [_connect(address) for _ in range(40)]
    try:
        assert within(5, lambda: len(coordinator._unproven) <= 8), len(coordinator._unproven)
    finally:
        for connection in flood:
            connection.close()
    assert within(5, lambda: not coordinator._unproven)
    rank0 = warm_member(address, 0)
    assert rank0.next_plan().rank == 0
    rank0.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"


def test_a_hello_dripped_a_byte_at_a_time_is_cut_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: the hello's timeout applied to each read: a byte just under it kept the connection."""
    monkeypatch.setattr(coordinator_module, "HELLO_TIMEOUT_S", 1.0)
    host = Host()
    coordinator, address, _ = start_coordinator(host, world=1, spares=0)
    connection = _connect(address)
    connection.recv(4096)  # the challenge
    started, cut = time.monotonic(), False
    try:
        while time.monotonic() - started < 6:
            connection.sendall(b"{")
            time.sleep(0.3)
    except OSError:
        cut = True
    assert cut and time.monotonic() - started < 3, "the drip kept the connection past the hello's deadline"
    assert within(5, lambda: coordinator.refused == 1)


def test_a_proof_that_is_not_ascii_is_refused_and_counted() -> None:
    host = Host()
    coordinator, address, _ = start_coordinator(host, world=1, spares=0)
    line = Line(_connect(address))
    challenge = line.receive()
    assert challenge is not None
    line.send({"op": "hello", "slot": 0, "node": "evil", "address": "10.6.6.6", "pid": 1, "proof": "é" * 64})
    assert line.receive() is None, "the connection stayed open"
    assert within(5, lambda: coordinator.refused == 1)


def test_a_lost_without_its_step_is_that_members_end() -> None:
    """Review: a `lost` without `step` killed the member's thread with a KeyError; the member stayed
    active, never taken for dead."""
    host = Host()
    coordinator, address, _ = start_coordinator(host, world=2, spares=1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank1.line.send({"op": "lost"})
    assert within(5, lambda: [e for _, e in host.named("warm_failure")] != []), "rank 1 was not taken as gone"
    assert host.named("warm_failure")[0][1]["rank"] == 1


def test_a_flood_of_refusals_is_recorded_in_a_few_events_that_count_them_all() -> None:
    """Review: 300 junk connections in 0.7 s wrote 300 warm_refused lines into the user's files."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=1, spares=0)
    for _ in range(60):
        connection = _connect(address)
        connection.recv(4096)  # the challenge
        connection.sendall(b"[]\n")  # no hello
        connection.close()
    assert within(10, lambda: coordinator.refused == 60), coordinator.refused
    rank0 = warm_member(address, 0)
    rank0.next_plan()
    rank0.done()
    outcome["thread"].join(timeout=10)
    events = [event for _, event in host.named("warm_refused")]
    assert len(events) <= coordinator_module.REFUSALS_EACH + 2, len(events)
    assert sum(event["count"] for event in events) == 60


def test_a_member_follows_no_plan_that_does_not_prove_the_jobs_secret() -> None:
    """Review of item 1: members proved the secret to the coordinator, not the other way round: a
    spare retrying after its coordinator died could reach a stranger who bound the freed port and
    follow its plan (an address of the stranger's choosing). Plans answer the member's nonce."""
    import threading

    from experiments.warm.member import CoordinatorGone
    from experiments.warm.protocol import Plan

    impostor = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{impostor.getsockname()[1]}"

    def plan_a_stranger() -> None:
        connection, _ = impostor.accept()
        line = Line(connection)
        line.send({"op": "challenge", "nonce": "00"})
        line.receive()  # the hello, with its proof for a nonce the impostor chose: worth nothing to it
        line.send({**Plan(1, 4, 1, 2, "10.6.6.6", 29500, "peer", 0, 57, 0.0, None).message(), "proof": "0" * 64})

    threading.Thread(target=plan_a_stranger, daemon=True).start()
    member = warm_member(address, 2)
    with pytest.raises(CoordinatorGone, match="does not prove the job's secret"):
        member.next_plan()
    impostor.close()


def test_a_stranger_holding_every_unproven_place_does_not_keep_a_member_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-review: a stranger who kept MAX_UNPROVEN connections open (each renewed within the hello's
    deadline) turned every real member away at once, uncounted: the job never started or recovered.
    The newest connection now takes the oldest's place (the stranger's, counted), and a member whose
    connection ends before its challenge connects again."""
    monkeypatch.setattr(coordinator_module, "MAX_UNPROVEN", 8)
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=1, spares=0)
    held = [_connect(address) for _ in range(8)]
    try:
        for connection in held:
            connection.recv(4096)  # its challenge: every place taken
        rank0 = warm_member(address, 0)
        assert rank0.next_plan().rank == 0
        rank0.done()
        outcome["thread"].join(timeout=10)
        assert outcome.get("verdict") == "completed"
        assert within(5, lambda: coordinator.refused >= 1), "the stranger's connection made way uncounted"
    finally:
        for connection in held:
            connection.close()


def test_a_hello_nested_too_deep_for_the_parser_is_refused_and_counted() -> None:
    """Re-review: json.loads raised RecursionError on 16,000 nested brackets: the connection's thread
    died with a traceback on the job's stderr, nothing counted, the socket left open."""
    host = Host()
    coordinator, address, _ = start_coordinator(host, world=1, spares=0)
    line = Line(_connect(address))
    assert line.receive() is not None  # the challenge
    line.connection.sendall(b"[" * 16000 + b"\n")
    assert line.receive() is None, "the connection stayed open"
    assert within(5, lambda: coordinator.refused == 1)


def test_what_a_refusal_records_of_the_strangers_words_is_bounded() -> None:
    """Re-review: the refusal's `why` repeated the stranger's slot value: ~16 KB of its choosing per event."""
    host = Host()
    coordinator, address, _ = start_coordinator(host, world=1, spares=0)
    line = Line(_connect(address))
    assert line.receive() is not None
    line.send({"op": "hello", "slot": "A" * 15000, "node": "n", "address": "a", "pid": 1})
    assert line.receive() is None
    assert within(5, lambda: coordinator.refused == 1)
    [event] = [event for _, event in host.named("warm_refused")]
    assert len(event["why"]) <= coordinator_module.REFUSAL_WHY_CHARS, len(event["why"])
