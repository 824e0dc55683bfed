"""restart.strategy elastic on several nodes: a node other than the main one takes torchrun's next
round only once the main node has fenced it for this job (re-review of issue 27's elastic rounds)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.layout import RunPaths
from experiments.runtime import command
from experiments.runtime.command import Supervisor
from experiments.runtime.fence import Fence, StaleAttemptError, write_fence


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    monkeypatch.setattr(command, "ROUND_FENCE_WAIT_S", 0.2)
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir(parents=True)
    return SimpleNamespace(paths=paths)


def test_a_fence_with_no_job_yet_is_not_the_main_nodes_move(node: SimpleNamespace) -> None:
    """The controller writes '<attempt> -' while it submits the next attempt: a node that took
    that for the main node's fence registered the old job's workers as the new attempt's ranks."""
    write_fence(node.paths, Fence(1, None, "d1"))
    with pytest.raises(StaleAttemptError, match="no job"):
        Supervisor._await_fence(node, 1, "j1", "d1")


def test_the_main_nodes_fence_for_this_job_is_taken(node: SimpleNamespace) -> None:
    write_fence(node.paths, Fence(1, "j1", "d1"))
    started = time.monotonic()
    Supervisor._await_fence(node, 1, "j1", "d1")
    assert time.monotonic() - started < 0.2


def test_a_round_that_cannot_be_taken_ends_torchrun_instead_of_training_unwatched() -> None:
    """An error while taking a round (ESTALE reading the fence over NFS) ended the thread that
    registers rounds: torchrun trained on, no later round registered."""
    def stale(*_: object) -> bool:
        raise OSError(116, "Stale file handle")

    node = SimpleNamespace(_take_round=stale, child=None)
    assert Supervisor._next_round(node, 1, 0, time.time()) is False
