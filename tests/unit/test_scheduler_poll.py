"""The scheduler's slow path: a respectful interval, early polls only for news, a slow scheduler
stretching the interval, a failing one retried with a growing wait until its deadline."""

from __future__ import annotations

import threading
import time

import pytest
from clocks import ManualClock

from orchestrator.commands import CommandError, run_command
from orchestrator.observe.scheduler_poll import URGENT_MIN_S, SchedulerPoller, SchedulerUnavailable
from orchestrator.states import JobState


class CountingScheduler:
    """Answers RUNNING for every job, taking ``took_s`` of the clock; fails while ``down``."""

    name = "slurm"

    def __init__(self, clock: ManualClock, took_s: float = 0.0) -> None:
        self.clock, self.took_s, self.calls, self.down = clock, took_s, 0, False

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        self.calls += 1
        self.clock.now += self.took_s
        if self.down:
            raise CommandError(["squeue"], 1, "", "Unable to contact slurm controller", "command failed")
        return {job_id: JobState.RUNNING for job_id in job_ids}


def poller(clock: ManualClock, interval_s: float = 5.0, timeout_s: float = 60.0) -> SchedulerPoller:
    return SchedulerPoller(interval_s, timeout_s, clock=clock)


def test_polls_once_per_interval_whatever_the_fast_loop_does() -> None:
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock)
    answered = []
    for _ in range(100):  # 20 s of a 0.2 s fast loop
        answered.append(bool(slow_path.poll(scheduler, ["1", "2"])))
        clock.now += 0.2
    assert scheduler.calls == 4 == sum(answered)
    assert slow_path.stats.calls == 4


def test_the_jobs_are_listed_only_when_a_poll_is_due() -> None:
    """Issue 29: the ids of every job the drill watches (10,000 with a sweep's waiting elements)
    were listed every round, for a poll due once in twenty."""
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock)
    listed = 0

    def job_ids() -> list[str]:
        nonlocal listed
        listed += 1
        return ["1", "2"]

    for _ in range(100):  # 20 s of a 0.2 s fast loop
        slow_path.poll(scheduler, job_ids)
        clock.now += 0.2
    assert listed == scheduler.calls == 4


def test_news_brings_the_poll_forward_but_not_more_than_once_a_second() -> None:
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock)
    assert slow_path.poll(scheduler, ["1"]) == {"1": JobState.RUNNING}
    clock.now += 0.5
    assert slow_path.poll(scheduler, ["1"], urgent=True) == {}, "an early poll waits URGENT_MIN_S"
    clock.now += URGENT_MIN_S
    assert slow_path.poll(scheduler, ["1"], urgent=True) == {"1": JobState.RUNNING}
    assert scheduler.calls == 2


def test_a_slow_scheduler_is_asked_less_often() -> None:
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock, took_s=2.0), poller(clock)
    slow_path.poll(scheduler, ["1"])
    clock.now += 10.0
    assert slow_path.poll(scheduler, ["1"]) == {}, "a 2 s poll waits 10 x 2 s for the next"
    clock.now += 8.1
    assert slow_path.poll(scheduler, ["1"]) != {}


def test_a_failing_scheduler_is_retried_with_a_growing_wait_then_named_at_its_deadline() -> None:
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock, interval_s=1.0, timeout_s=20.0)
    scheduler.down = True
    tries = []
    while True:
        try:
            assert slow_path.poll(scheduler, ["1"]) == {}, "no news while it fails: never failure or success"
        except SchedulerUnavailable as error:
            assert "slurm" in str(error) and "scheduler_timeout_s = 20" in str(error)
            break
        tries.append(clock.now) if scheduler.calls > len(tries) else None
        clock.now += 0.1
    gaps = [later - earlier for earlier, later in zip(tries, tries[1:], strict=False)]
    assert gaps[:3] == pytest.approx([1.0, 2.0, 4.0], abs=0.11), gaps
    assert clock.now - 1000.0 == pytest.approx(20.0, abs=0.2), "the deadline is kept, not overshot by a wait"


def test_it_answers_again_and_the_interval_comes_back() -> None:
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock, interval_s=5.0, timeout_s=60.0)
    scheduler.down = True
    slow_path.poll(scheduler, ["1"])
    scheduler.down = False
    clock.now += 5.0
    assert slow_path.poll(scheduler, ["1"]) == {"1": JobState.RUNNING}
    assert slow_path.stats.failures == 1


class HangingScheduler:
    """A squeue that does not return until released (slurmctld gone: each try waits out its timeout)."""

    name = "slurm"

    def __init__(self) -> None:
        self.release, self.entered = threading.Event(), threading.Event()

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        self.entered.set()
        assert self.release.wait(30), "never released"
        return {job_id: JobState.RUNNING for job_id in job_ids}


def test_a_hanging_poll_never_holds_up_the_fast_path_and_its_answer_is_taken_when_it_comes() -> None:
    clock, scheduler = ManualClock(), HangingScheduler()
    slow_path = SchedulerPoller(5.0, 60.0, clock=clock, background=True)
    try:
        assert slow_path.poll(scheduler, ["1"]) == {}, "the poll went to its thread; no answer yet"
        assert scheduler.entered.wait(10)
        clock.now += 30
        assert slow_path.poll(scheduler, ["1"]) == {}, "still waiting: no news, and no second poll"
        scheduler.release.set()
        answer = wait_for_answer(slow_path, scheduler)
        assert answer == {"1": JobState.RUNNING} and slow_path.stats.calls == 1
    finally:
        scheduler.release.set()
        slow_path.close()


def test_a_poll_that_hangs_past_the_deadline_names_the_scheduler() -> None:
    clock, scheduler = ManualClock(), HangingScheduler()
    slow_path = SchedulerPoller(5.0, 20.0, clock=clock, background=True)
    try:
        slow_path.poll(scheduler, ["1"])
        assert scheduler.entered.wait(10)
        clock.now += 21
        with pytest.raises(SchedulerUnavailable, match=r"\(slurm\) has not answered for 21 s.*a poll still waits"):
            slow_path.poll(scheduler, ["1"])
    finally:
        scheduler.release.set()
        slow_path.close()


def wait_for_answer(slow_path: SchedulerPoller, scheduler: HangingScheduler) -> dict[str, JobState]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        answer = slow_path.poll(scheduler, ["1"])
        if answer:
            return answer
        time.sleep(0.01)
    raise AssertionError("the released poll's answer never came")


class TwoCommandScheduler:
    """A poll that runs two real commands through the one wrapper (squeue, then sacct for the rest)."""
    name = "two-commands"

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        run_command(["true"])
        run_command(["true"])
        return {job_id: JobState.RUNNING for job_id in job_ids}


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.drill
def test_the_commands_each_poll_ran_are_counted(background: bool) -> None:
    slow_path = SchedulerPoller(0.0, 60.0, background=background)
    scheduler = TwoCommandScheduler()
    deadline = time.monotonic() + 10
    answers = 0
    while answers < 3 and time.monotonic() < deadline:
        answers += bool(slow_path.poll(scheduler, ["1", "2", "3"]))
        time.sleep(0.01)
    slow_path.close()
    assert answers == 3 and slow_path.stats.calls == 3 and slow_path.stats.commands == 6


def test_an_interval_longer_than_a_minute_is_kept() -> None:
    """Issue 21, item 10: scheduler_poll_s allows 600 s (a site that asks for it); it was cut to 60."""
    clock = ManualClock()
    scheduler, slow_path = CountingScheduler(clock), poller(clock, interval_s=300.0, timeout_s=3600.0)
    for _ in range(900):  # 15 minutes of a 1 s loop
        slow_path.poll(scheduler, ["1"])
        clock.now += 1.0
    assert scheduler.calls == 3


def test_a_step_of_the_wall_clock_neither_ends_the_drill_nor_stops_the_polls() -> None:
    """Issue 21, item 10: the poller schedules on the monotonic clock; the wall clock only dates
    the answers (a job's state from before its attempt was accepted says nothing of it)."""
    clock, wall = ManualClock(), ManualClock()
    scheduler = CountingScheduler(clock)
    slow_path = SchedulerPoller(5.0, 60.0, clock=clock, wall=wall)
    assert slow_path.poll(scheduler, ["1"]) and slow_path.answered_as_of == wall.now
    scheduler.down = True
    clock.now += 5.0
    assert slow_path.poll(scheduler, ["1"]) == {}  # failing since now
    wall.now += 3600.0  # NTP steps the wall clock an hour forward: no silence of an hour
    clock.now += 10.0
    scheduler.down = False
    assert slow_path.poll(scheduler, ["1"]) == {"1": JobState.RUNNING}
    wall.now -= 7200.0  # and two hours back: the polls go on at their interval
    calls = scheduler.calls
    for _ in range(60):  # 12 s: polls at ~5 and ~10 s
        slow_path.poll(scheduler, ["1"])
        clock.now += 0.2
    assert scheduler.calls == calls + 2
