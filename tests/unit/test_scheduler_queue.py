"""The runs whose job waits in the scheduler's queue (orchestrator/control/scheduler_queue.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.control.scheduler_queue import SchedulerQueue, array_place
from orchestrator.states import JobState

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("job_id", "place"), [
    ("123_4", ("123", 4)), ("123_40;east", ("123;east", 40)),  # Slurm, and under -M
    ("123[4].server", ("123.server", 4)), ("69[12]", ("69", 12)),  # PBS, and the wrappers' bare ids
    ("123", ("123", 0)), ("123.server", ("123.server", 0)), ("123;east", ("123;east", 0)),
])
def test_an_array_elements_place_is_its_array_and_index(job_id: str, place: tuple[str, int]) -> None:
    assert array_place(job_id) == place


@dataclass
class Run:
    job_id: str


def ids(runs: list[Any]) -> list[str]:
    return sorted(run.job_id for run in runs)


def test_each_array_is_read_from_its_lowest_pending_index_and_the_poll_takes_back_any_other() -> None:
    queue = SchedulerQueue(heads=2)
    runs = {job: Run(job) for job in ("7_10", "7_2", "7_1", "7_3", "8_0", "8_1", "9")}
    for run in runs.values():
        queue.park(run)  # type: ignore[arg-type]
    assert len(queue) == 7
    heads = queue.take_back({})
    assert ids(heads) == ["7_1", "7_2", "8_0", "8_1", "9"]
    assert len(queue) == 7, "the first elements are read, not taken out"
    # the poll: 7_10 started out of order, 9 ended; a pending element stays
    taken = queue.take_back({"7_10": JobState.RUNNING, "9": JobState.FAILED, "7_3": JobState.PENDING})
    assert [run.job_id for run in taken[:2]] == ["7_10", "9"] and len(queue) == 5
    queue.settle(runs["7_1"])  # type: ignore[arg-type]  # read this round and heard from
    assert ids(queue.take_back({})) == ["7_2", "7_3", "8_0", "8_1"]
    assert sorted(queue.job_ids()) == ["7_2", "7_3", "8_0", "8_1"]
    assert queue.holds(runs["7_2"]) and not queue.holds(runs["7_1"])  # type: ignore[arg-type]
