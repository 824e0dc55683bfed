"""experiments/task.py's reading of submitit's pickled call: waited for as submitit waits (an array
element may start before its pickle is in place), named when it never comes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from submitit.core import utils as submitit_utils

from experiments import task

pytestmark = pytest.mark.unit


def test_a_pickle_that_comes_late_is_waited_for_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "9_submitted.pkl"
    looks: list[float] = []

    def arrives_while_waiting(seconds: float) -> None:
        looks.append(seconds)
        submitit_utils.DelayedSubmission(json.loads, "[1, 2]").dump(path)

    monkeypatch.setattr(task.time, "sleep", arrives_while_waiting)
    call = task.load_call(path)
    assert looks == [task.PICKLE_LOOK_S], "it looked, waited once, then read"
    assert call.result() == [1, 2]


def test_a_pickle_that_never_comes_is_named(tmp_path: Path) -> None:
    path = tmp_path / "9_submitted.pkl"
    with pytest.raises(RuntimeError, match="9_submitted.pkl is still missing"):
        task.load_call(path, wait_s=0.0)


def test_a_pickle_of_something_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "9_submitted.pkl"
    submitit_utils.cloudpickle_dump({"not": "a call"}, path)
    with pytest.raises(RuntimeError, match="holds a dict"):
        task.load_call(path)
