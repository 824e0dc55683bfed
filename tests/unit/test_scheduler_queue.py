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
    begun: bool = False  # its attempt's directory is there


def ids(runs: list[Any]) -> list[str]:
    return sorted(run.job_id for run in runs)


def test_each_array_is_looked_at_from_its_lowest_pending_index_and_the_poll_takes_back_any_other() -> None:
    queue = SchedulerQueue(heads=2)
    runs = {job: Run(job) for job in ("7_10", "7_2", "7_1", "7_3", "8_0", "8_1", "9")}
    for run in runs.values():
        queue.park(run)  # type: ignore[arg-type]  # a stand-in with the job id the queue reads
    looked: list[str] = []

    def begun(run: Any) -> bool:
        looked.append(run.job_id)
        return bool(run.begun)

    assert queue.take_back({}, begun) == [] and len(queue) == 7
    assert sorted(looked) == ["7_1", "8_0", "9"], "nothing began: one look at each array's lowest"
    for job in ("7_1", "7_2", "7_3", "8_1"):
        runs[job].begun = True  # their jobs made their directories
    # the poll: 7_10 started out of order, 9 ended; a pending element stays
    taken = queue.take_back({"7_10": JobState.RUNNING, "9": JobState.FAILED, "7_3": JobState.PENDING}, begun)
    assert ids(taken) == ["7_1", "7_10", "7_2", "9"], "7's two lowest (heads=2 a round); 8_1 waits behind 8_0"
    assert ids(queue.take_back({}, begun)) == ["7_3"]
    assert sorted(queue.job_ids()) == ["8_0", "8_1"]
