"""The control loop's schedule (issue 29): a round every interval on the monotonic clock, not a
sleep after each round's work; a round whose work ran past its tick starts the next at once and
says by how much the loop was behind."""

from __future__ import annotations

import threading

import pytest

from orchestrator.control.ticks import Ticks

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Stop(threading.Event):
    """Records each wait instead of waiting; the clock moves by it."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock, self.waits = clock, []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(round(timeout or 0.0, 6))
        self.clock.now += timeout or 0.0
        return False


def test_a_round_waits_what_is_left_of_its_interval_not_a_whole_interval_after_its_work() -> None:
    clock = _Clock()
    ticks, stop = Ticks(0.1, clock=clock), _Stop(clock)
    ticks.wait(stop)  # the first round: a whole interval from now
    for work_s in (0.03, 0.07, 0.0):
        clock.now += work_s
        ticks.wait(stop)
    assert stop.waits == [0.1, 0.07, 0.03, 0.1], "every round starts 0.1 s after the one before it"
    assert (ticks.rounds, ticks.rounds_behind, ticks.behind_s_max) == (4, 0, 0.0)


def test_a_round_that_ran_past_its_tick_starts_the_next_at_once_and_says_how_far_behind() -> None:
    clock = _Clock()
    ticks, stop = Ticks(0.1, clock=clock), _Stop(clock)
    ticks.wait(stop)
    clock.now += 0.35  # one slow round (a resubmission's fork, a large commit)
    ticks.wait(stop)
    clock.now += 0.01
    ticks.wait(stop)
    assert stop.waits == [0.1, 0.09], "no wait after the slow round; the schedule goes on from its end"
    assert ticks.rounds_behind == 1 and ticks.behind_s_max == pytest.approx(0.25)
