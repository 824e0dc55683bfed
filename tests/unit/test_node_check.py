"""Issue 24, goal 2: a node whose ranks all fell silent is checked (can the scheduler still start a
step there?) and, if it does not answer, lost at once, dated to its last beat; a node that answers
is alive (a stall, a slow step) and is not checked again before twice the silence; silence is
measured against the attempt's pace and never inside a long phase the ranks announced."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from orchestrator.backends.base import NodeAnswer
from orchestrator.observe import node_check
from orchestrator.observe.node_check import NODE_CHECK_EVIDENCE, NodeChecks
from orchestrator.observe.watch import RankBeat
from orchestrator.states import JobState

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
NODES = {0: "n2", 1: "n3"}


class _Inline:
    """An executor that runs each check at once (the controller's runs it on a thread)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done


class _Backend:
    def __init__(self, dead: set[str]) -> None:
        self.dead = dead
        self.asked: list[str] = []

    def node_answers(self, job_id: str, node: str, timeout_s: float) -> NodeAnswer:
        self.asked.append(node)
        return NodeAnswer(node not in self.dead, "no step started on it within 3 s" if node in self.dead else "ran")


def _watch(beats: dict[int, float], pace: float | None = 20.0, allowed: float | None = None) -> Any:
    return SimpleNamespace(attempt=0, job_id="77", state=JobState.RUNNING, steps_per_s=lambda: pace,
                           beats={rank: RankBeat(at - 0.01, allowed, None, at) for rank, at in beats.items()})


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[set[str]], tuple[NodeChecks, _Backend]]:
    monkeypatch.setattr(node_check, "read_identity", lambda root, attempt, rank: SimpleNamespace(node=NODES[rank]))

    def make(dead: set[str]) -> tuple[NodeChecks, _Backend]:
        backend = _Backend(dead)
        run = SimpleNamespace(run_id="r000", paths=SimpleNamespace(root=tmp_path))
        return NodeChecks(run, backend, 5.0, _Inline()), backend  # type: ignore[arg-type]  # stand-ins
    return make


def test_a_silent_node_that_does_not_answer_is_lost_at_its_last_beat(checks: Any) -> None:
    found, backend = checks({"n3"})
    watch = _watch({0: T0, 1: T0 - 0.2})
    assert found.lost(watch, T0 + 4.0) is None and backend.asked == [], "4 s of silence: not yet"
    assert found.lost(watch, T0 + 5.5) is None, "the checks start; their answers are read next round"
    assert sorted(backend.asked) == ["n2", "n3"]
    sign = found.lost(watch, T0 + 5.6)
    assert sign is not None and sign.node == "n3" and sign.evidence == NODE_CHECK_EVIDENCE
    assert sign.at == pytest.approx(T0 - 0.21), "dated to the node's last beat, on its own clock"
    assert "node n3 lost" in sign.reason and "within 3 s" in sign.reason


def test_a_stalled_node_that_answers_is_alive_and_not_checked_again_before_twice_the_silence(checks: Any) -> None:
    found, backend = checks(set())
    watch = _watch({0: T0, 1: T0})
    for now in (T0 + 5.5, T0 + 5.6, T0 + 8.0, T0 + 9.9):
        assert found.lost(watch, now) is None
    assert sorted(backend.asked) == ["n2", "n3"], "each checked once"
    found.lost(watch, T0 + 10.5)
    assert len(backend.asked) == 4, "again past twice the silence"


def test_a_node_that_beat_again_after_its_check_began_is_not_lost(checks: Any) -> None:
    found, backend = checks({"n3"})
    found.lost(_watch({0: T0, 1: T0}), T0 + 5.5)
    assert found.lost(_watch({0: T0 + 5.55, 1: T0 + 5.55}), T0 + 5.6) is None


def test_no_check_while_the_ranks_beat_within_their_pace_or_announced_a_long_phase(checks: Any) -> None:
    found, backend = checks({"n2", "n3"})
    assert found.lost(_watch({0: T0, 1: T0}, pace=0.1), T0 + 20.0) is None, "10 s a step: silent past 30 s only"
    assert found.lost(_watch({0: T0, 1: T0}, allowed=300.0), T0 + 60.0) is None, "a checkpoint announced"
    assert backend.asked == []
    found.lost(_watch({0: T0, 1: T0}, pace=0.1), T0 + 31.0)
    assert sorted(backend.asked) == ["n2", "n3"]
