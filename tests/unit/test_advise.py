"""faultdrill advise (issue 11): Young's and Daly's intervals and Daly's goodput model. The
intervals are checked against the model they come from: Daly's is (close to) the interval that
maximizes the predicted goodput, found here by brute force; Young's is its first-order form."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from drills import FAULTDRILL
from orchestrator.report.advise import (
    AdviceError,
    AdviceInputs,
    advise,
    daly_interval,
    predicted_goodput,
    young_interval,
)


def _best_interval(checkpoint_s: float, mtbf_s: float, restart_s: float) -> float:
    """The goodput model's optimum, by a fine search (1/2000 of the range up to 3 MTBF)."""
    grid = [mtbf_s * 3 * i / 20000 for i in range(1, 20001)]
    return max(grid, key=lambda tau: predicted_goodput(tau, checkpoint_s, mtbf_s, restart_s))


def test_the_intervals_of_a_known_case() -> None:
    # delta 10 s, M 1 h: Young sqrt(2*10*3600) = 268.33 s; Daly 268.33*(1 + sqrt(1/720)/3 + 1/6480) - 10.
    assert young_interval(10, 3600) == pytest.approx(268.328, abs=1e-3)
    assert daly_interval(10, 3600) == pytest.approx(268.328 * (1 + math.sqrt(1 / 720) / 3 + 1 / 6480) - 10, abs=1e-3)


@pytest.mark.parametrize("checkpoint_s,mtbf_s,restart_s", [(10, 3600, 60), (1, 600, 5), (30, 900, 0), (0.2, 120, 3)])
def test_dalys_interval_is_the_goodput_models_optimum_and_young_is_near(checkpoint_s: float, mtbf_s: float,
                                                                        restart_s: float) -> None:
    best = _best_interval(checkpoint_s, mtbf_s, restart_s)
    daly, young = daly_interval(checkpoint_s, mtbf_s), young_interval(checkpoint_s, mtbf_s)
    assert daly == pytest.approx(best, rel=0.01)
    optimum = predicted_goodput(best, checkpoint_s, mtbf_s, restart_s)
    assert predicted_goodput(daly, checkpoint_s, mtbf_s, restart_s) == pytest.approx(optimum, rel=1e-4)
    assert optimum - predicted_goodput(young, checkpoint_s, mtbf_s, restart_s) < 0.01 * optimum
    for off in (0.5, 2.0):  # a worse interval predicts less
        assert predicted_goodput(daly * off, checkpoint_s, mtbf_s, restart_s) < optimum


def test_goodput_without_failures_is_the_share_of_time_not_spent_checkpointing() -> None:
    assert predicted_goodput(90, 10, 1e12) == pytest.approx(0.9, rel=1e-6)
    assert predicted_goodput(90, 10, 1e12, restart_s=1e3) == pytest.approx(0.9, rel=1e-6)


def test_a_checkpoint_dearer_than_twice_the_mtbf_checkpoints_every_mtbf() -> None:
    assert daly_interval(300, 100) == 100


def test_intervals_in_steps_and_the_one_in_use() -> None:
    intervals = advise(AdviceInputs(checkpoint_s=2, mtbf_s=900, restart_s=10, step_s=0.05, every_steps=200))
    young, daly, in_use = intervals
    assert (young.rule, daly.rule, in_use.rule) == ("Young", "Daly", "in use")
    assert young.steps == round(60 / 0.05) and in_use.seconds == pytest.approx(10.0)
    assert in_use.goodput < daly.goodput and young.lost_per_failure_s == pytest.approx(30)


@pytest.mark.parametrize("given,named", [
    ({"checkpoint_s": 0, "mtbf_s": 10}, "checkpoint cost"),
    ({"checkpoint_s": 1, "mtbf_s": float("inf")}, "MTBF"),
    ({"checkpoint_s": 1, "mtbf_s": 10, "restart_s": -1}, "restart"),
    ({"checkpoint_s": 1, "mtbf_s": 10, "every_steps": 10}, "--every-steps"),
])
def test_bad_inputs_are_named(given: dict, named: str) -> None:
    with pytest.raises(AdviceError, match=named):
        AdviceInputs(**given)


@pytest.mark.drill
def test_the_command_needs_a_workdir_or_a_cost_and_says_so() -> None:
    done = subprocess.run([*FAULTDRILL, "advise", "--mtbf", "600"], capture_output=True, text=True)
    assert done.returncode == 2 and "WORKDIR" in done.stderr and "--cost" in done.stderr


def test_a_workdirs_inputs_are_the_means_over_the_runs_that_measured_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that wrote no checkpoint or measured no step time do not pull the means down; every
    recovery counts, twins' included; one interval for all runs is the one in use."""
    from orchestrator.report import advise as advise_module

    def run(count: int, blocking: float, step_s: float | None, ttrs: list[float]) -> dict:
        return {"checkpoint_every_steps": 50, "step_time_s": step_s,
                "checkpoints": {"count": count, "mean_blocking_s": blocking},
                "recoveries": [{"ttr_s": ttr} for ttr in ttrs]}

    report = {"runs": [run(4, 0.2, 0.01, [3.0]), run(0, 0.0, None, [5.0]), run(2, 0.4, 0.03, [])]}
    monkeypatch.setattr(advise_module, "build_report", lambda workdir: report)
    inputs = advise_module.inputs_from_workdir(Path("/drill"), mtbf_s=600)
    assert inputs.checkpoint_s == pytest.approx(0.3)  # (0.2 + 0.4) / 2: the run without checkpoints is left out
    assert inputs.step_s == pytest.approx(0.02)  # (0.01 + 0.03) / 2
    assert inputs.restart_s == pytest.approx(4.0)  # (3 + 5) / 2
    assert inputs.every_steps == 50 and "2 run(s) with checkpoints, 2 recovery(ies)" in inputs.source
    assert advise_module.inputs_from_workdir(Path("/drill"), mtbf_s=600, restart_s=9.0).restart_s == 9.0
