"""Reading an attempt's node clocks (issue 22, item 1) with real processes whose clocks are set off
by libfaketime, as the skew profile sets the cluster's nodes: the controller's clock book talks to
``injectors.probe echo`` on each of the attempt's nodes (its batch host and its ranks' nodes) and
writes readings within their bounds of the true offsets to the attempt's clocks file; a node that
cannot be reached is named with why; a reading is used again while it is fresh."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from experiments.layout import RankIdentity, RunPaths, append_json_line, write_json_atomic
from orchestrator.backends.local.backend import LocalBackend
from orchestrator.commands import Conversation
from orchestrator.observe.node_clocks import ClockBook
from orchestrator.record.clocks import AttemptClocks, ClockReading, load_clocks, save_clocks

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
OFFSETS = {"n1": -0.8, "n2": 1.3}  # what each "node"'s clock is set off by
SCHEDULING_SLACK_S = 0.05  # libfaketime's offset is exact; the bound is half the quickest round trip

pytestmark = pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime is not installed (scripts/install-deps)")


class SkewedNodes(LocalBackend):
    """This host as several nodes, each a process with its own clock; n3 cannot be reached."""

    one_clock = False

    def __init__(self) -> None:
        super().__init__("clocks")
        self.talks: list[str] = []

    def talk_on_node(self, job_id: str, node: str, argv: list[str]) -> Conversation:
        self.talks.append(node)
        if node not in OFFSETS:
            return Conversation(["false"])
        env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{OFFSETS[node]:+}",
               "PATH": "/usr/bin:/bin"}
        return Conversation([sys.executable, *argv], env=env)


def _attempt(paths: RunPaths, attempt: int, nodes: list[str]) -> None:
    append_json_line(paths.events_file(attempt), {"event": "job_start", "time": 0.0, "node": nodes[0]})
    for rank, node in enumerate(nodes):
        write_json_atomic(paths.rank_file(attempt, rank), asdict(RankIdentity(
            rank=rank, pid=1, create_time=0.0, host=node, node=node, job_id="7", attempt=attempt)))


def test_each_nodes_clock_is_read_within_its_bounds_and_kept_with_the_attempt(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r000")
    _attempt(paths, 0, ["n1", "n2", "n3"])
    backend = SkewedNodes()
    book = ClockBook(backend)
    try:
        clocks = book.read_attempt(paths, 0, 3, "7").result(timeout=120)
        assert sorted(clocks.readings) == ["n1", "n2"], clocks
        for node, offset in OFFSETS.items():
            reading = clocks.readings[node]
            assert abs(reading.offset_s - offset) <= reading.uncertainty_s + SCHEDULING_SLACK_S, (node, reading)
            assert reading.uncertainty_s < 0.05 and reading.exchanges == 16
        assert "n3" in clocks.unmeasured and "it ended" in clocks.unmeasured["n3"], clocks.unmeasured
        assert load_clocks(paths.clocks_file(0)) == clocks, "the attempt's clocks file holds what was read"

        # The next attempt on the same nodes within REUSE_S: the readings are used again, no talk.
        _attempt(paths, 1, ["n2", "n1"])
        again = book.read_attempt(paths, 1, 2, "8").result(timeout=120)
        assert again.readings == {node: clocks.readings[node] for node in ("n2", "n1")}
        assert backend.talks == ["n1", "n2", "n3"], backend.talks
    finally:
        book.close()


def test_the_local_backends_moments_are_on_one_clock(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "r000")
    _attempt(paths, 0, ["here"])
    book = ClockBook(LocalBackend("clocks"))
    try:
        clocks = book.read_attempt(paths, 0, 1, "1").result(timeout=30)
    finally:
        book.close()
    assert clocks.one_clock and not clocks.readings and load_clocks(paths.clocks_file(0)).one_clock


def test_a_re_read_keeps_what_an_earlier_read_of_the_attempt_found(tmp_path: Path) -> None:
    """Review: a restarted controller read an adopted attempt's clocks again after its job's nodes
    had ended, and wrote an empty file over the good readings."""
    paths = RunPaths(tmp_path / "r000")
    _attempt(paths, 0, ["n1", "n3"])
    save_clocks(paths.clocks_file(0), AttemptClocks(readings={"n3": ClockReading(0.25, 0.001, 16, 1.0)}))
    book = ClockBook(SkewedNodes())
    try:
        clocks = book.read_attempt(paths, 0, 2, "7").result(timeout=120)
    finally:
        book.close()
    assert clocks.readings["n3"] == ClockReading(0.25, 0.001, 16, 1.0) and "n3" not in clocks.unmeasured
    assert abs(clocks.readings["n1"].offset_s - OFFSETS["n1"]) < 0.05


def test_lines_that_arrive_in_one_chunk_are_each_answered_in_turn() -> None:
    """Review: a banner line and the probe's ready line in one write; the second sat in a reader's
    buffer while the descriptor had nothing more to signal, and the conversation timed out."""
    code = "import sys; sys.stdout.write('banner\\nready\\n'); sys.stdout.flush(); sys.stdin.read()"
    with Conversation([sys.executable, "-c", code]) as said:
        assert said.read_line(10) == "banner"
        assert said.read_line(2) == "ready"
