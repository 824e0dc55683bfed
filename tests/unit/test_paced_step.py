"""workload.step_s: a built-in workload's step that computes faster than the least step time waits
out the rest; a slower one is not held further. On a fake clock: the waits are exact."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import experiments.workloads.base as base
from experiments.workloads.base import Workload

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now, self.slept = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 9))
        self.now += seconds


@pytest.mark.parametrize("compute_s,least_s,waits", [(0.01, 0.05, [0.04]), (0.06, 0.02, []), (0.01, 0.0, [])])
def test_a_step_faster_than_the_least_step_time_waits_out_the_rest(monkeypatch, compute_s, least_s, waits) -> None:
    clock = FakeClock()
    monkeypatch.setattr(base, "time", clock)

    def train_step(step: int) -> float:
        clock.now += compute_s
        return float(step)

    loss = Workload.paced_step(SimpleNamespace(train_step=train_step), 7, least_s)  # type: ignore[arg-type]  # a stand-in with train_step alone
    assert loss == 7.0 and clock.slept == waits
