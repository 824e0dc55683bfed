"""Runs whose job waits in the scheduler's queue, kept out of the controller's rounds (issue 29).

A sweep submitted as job arrays has every run's first attempt out at once: 10,000 runs are 10,000
pending elements, of which only ``parallel_runs`` run (the arrays' throttles). A pending job has
nothing to read (no rank has started, nothing was written), so reading each one's files every
round made a round's cost follow the sweep's size, not the runs in flight.

Such a run waits here, in its array's order, until either
- the scheduler's poll says its job left the queue (RUNNING, or ended: the poll's answer names
  every job the drill holds, these too), or
- its attempt's directory, which the job makes first (its batch script's or rank's events), is
  there, looked at from its array's lowest waiting index on, up to the first that is not: a throttled
  array starts its lowest pending indices next, so the elements that start are seen at the round's
  pace for one look at the disk a round and array (a single job is its own array of one).

An element that starts out of order is taken back at the next poll: its failure is seen then, never
missed (the files keep what was written). Nothing is decided for a waiting run while it waits."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.control.tracker import RunTracker

HEADS = 64  # an array's waiting elements looked at in a round, at most (from the lowest, while they began)

# Slurm's ``123_4`` (``123_4;cluster`` under -M), PBS's ``123[4].server`` (``69[4]`` bare).
ARRAY_ELEMENT = re.compile(r"^(?P<base>[^_\[;]+)(?:_(?P<slurm>\d+)|\[(?P<pbs>\d+)\])(?P<rest>.*)$")


def array_place(job_id: str) -> tuple[str, int]:
    """(the array's id, the element's index) of an array element; (the job's id, 0) of any other."""
    match = ARRAY_ELEMENT.match(job_id)
    if match is None:
        return job_id, 0
    index = match.group("slurm") if match.group("slurm") is not None else match.group("pbs")
    return f"{match.group('base')}{match.group('rest')}", int(index)


@dataclass
class SchedulerQueue:
    """The waiting runs, by array and in index order; each run's job id for the poll."""

    heads: int = HEADS
    _arrays: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # array -> sorted (index, job id)
    _by_job: dict[str, "RunTracker"] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_job)

    def job_ids(self) -> list[str]:
        return list(self._by_job)

    def park(self, tracker: "RunTracker") -> None:
        job_id = tracker.job_id
        assert job_id is not None and job_id not in self._by_job
        array, index = array_place(job_id)
        bisect.insort(self._arrays.setdefault(array, []), (index, job_id))
        self._by_job[job_id] = tracker

    def take_back(self, states: dict[str, JobState], begun: Callable[["RunTracker"], bool]) -> list["RunTracker"]:
        """The runs the round works on again, out of the queue: those the poll says left it, and
        each array's waiting elements from its lowest index on that ``begun`` (one look at the disk
        each) says started, up to the first that did not (a throttle of N starts N together)."""
        started = {job_id for job_id, state in states.items()
                   if state is not JobState.PENDING and job_id in self._by_job}
        for elements in self._arrays.values():
            looked = 0
            for _, job_id in elements:
                if job_id in started:
                    continue
                if looked == self.heads or not begun(self._by_job[job_id]):
                    break
                looked += 1
                started.add(job_id)
        return [self._remove(job_id) for job_id in sorted(started)]

    def _remove(self, job_id: str) -> "RunTracker":
        tracker = self._by_job.pop(job_id)
        array, index = array_place(job_id)
        elements = self._arrays[array]
        del elements[bisect.bisect_left(elements, (index, job_id))]
        if not elements:
            del self._arrays[array]
        return tracker
