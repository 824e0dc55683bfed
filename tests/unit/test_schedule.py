"""Fault schedules: seeded and reproducible; the samplers follow their distributions (a
Kolmogorov-Smirnov test on 10,000 seeded draws); a job's failure rate grows with its ranks or nodes;
targets within the run; a plan per run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pytest

from injectors.ranks import RankFraction, choose_ranks
from injectors.schedule import AtStep, ExponentialDelay, FixedDelay, WeibullDelay, seeded_rng
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.control.controller import plan_faults

DRAWS = 10_000
# alpha = 0.001: a wrong formula (a rate not scaled by the ranks) gives D of 0.3 and more.
KS_CRITICAL = 1.95 / math.sqrt(DRAWS)


def ks_statistic(draws: list[float], cdf: Callable[[float], float]) -> float:
    """sup |F_n(x) - F(x)| over the sample."""
    ordered = sorted(draws)
    n = len(ordered)
    return max(max((i + 1) / n - cdf(x), cdf(x) - i / n) for i, x in enumerate(ordered))


def _sample(delay: ExponentialDelay | WeibullDelay, seed: str, **size: int) -> list[float]:
    rng = seeded_rng(seed)  # one stream, as a plan draws
    return [delay.draw(rng, **size) for _ in range(DRAWS)]


def test_exponential_draws_repeat_for_the_same_seed_and_differ_for_another() -> None:
    delay = ExponentialDelay(exponential=4.0)
    first = [delay.draw(seeded_rng("a", 1)) for _ in range(3)]
    again = [delay.draw(seeded_rng("a", 1)) for _ in range(3)]
    assert first == again and delay.draw(seeded_rng("a", 2)) != first[0]


def test_exponential_follows_its_distribution_and_scales_with_the_ranks() -> None:
    per_job = ExponentialDelay(exponential=20.0)
    draws = _sample(per_job, "exp")
    assert ks_statistic(draws, lambda x: 1 - math.exp(-x / 20.0)) < KS_CRITICAL
    per_rank = ExponentialDelay(exponential=20.0, per="rank")
    eight = _sample(per_rank, "exp8", ranks=8)
    assert ks_statistic(eight, lambda x: 1 - math.exp(-x * 8 / 20.0)) < KS_CRITICAL  # 8 ranks: 8x the rate
    assert per_rank.mean(ranks=8) == 2.5 and ExponentialDelay(exponential=20.0, per="node").mean(4, 2) == 10.0


def test_weibull_follows_its_distribution_and_the_first_of_n_nodes_fails_sooner() -> None:
    delay = WeibullDelay(weibull=30.0, shape=0.7)
    draws = _sample(delay, "wb")
    assert ks_statistic(draws, lambda x: 1 - math.exp(-((x / 30.0) ** 0.7))) < KS_CRITICAL
    per_node = WeibullDelay(weibull=30.0, shape=2.0, per="node")
    scale = 30.0 * 4 ** (-1 / 2.0)
    assert per_node.scale(ranks=16, nodes=4) == pytest.approx(scale)
    four = _sample(per_node, "wb4", ranks=16, nodes=4)
    assert ks_statistic(four, lambda x: 1 - math.exp(-((x / scale) ** 2.0))) < KS_CRITICAL


def test_clipping_and_fixed_and_step_schedules() -> None:
    clipped = [ExponentialDelay(exponential=2.0, min=1.0, max=3.0).draw(seeded_rng("c", i)) for i in range(2000)]
    assert min(clipped) >= 1.0 and max(clipped) == 3.0
    assert FixedDelay(fixed=1.25).draw(seeded_rng()) == 1.25 and AtStep(at_step=40).draw(seeded_rng()) == 0.0


def test_rank_choice_is_checked_against_the_world() -> None:
    rng = seeded_rng("r")
    assert {choose_ranks("random", 4, rng) for _ in range(200)} == {(0,), (1,), (2,), (3,)}
    assert choose_ranks([3, 1, 3], 4, rng) == (1, 3)
    halves = {choose_ranks(RankFraction(fraction=0.5), 4, rng) for _ in range(200)}
    assert all(len(ranks) == 2 and len(set(ranks)) == 2 for ranks in halves) and len(halves) > 1
    assert len(choose_ranks(RankFraction(fraction=0.01), 4, rng)) == 1  # at least one rank
    with pytest.raises(ValueError, match="ranks 0..1"):
        choose_ranks(5, 2, rng)
    with pytest.raises(ValueError, match="ranks 0..1"):
        choose_ranks([0, 2], 2, rng)


def _run(tmp_path: Path, faults: list[dict], **extra: object):  # noqa: ANN202 - a RunConfig
    raw = {"name": "p", "workdir": str(tmp_path / "w"), "resources": {"tasks_per_node": 4}, "faults": faults, **extra}
    return expand_runs(parse_campaign(raw, base_dir=tmp_path))[0]


def test_plan_is_reproducible_per_run_and_a_failure_model_repeats_up_to_its_cap(tmp_path: Path) -> None:
    run = _run(tmp_path, [{"after": {"exponential": 5, "per": "rank"}, "repeat": 3},
                          {"after": {"fixed": 2}, "rank": 3, "signal": "TERM"},
                          {"kind": "stall-rank", "after": {"at_step": 30}, "rank": {"fraction": 0.5}, "duration_s": 1}])
    plan = plan_faults(run)
    assert plan == plan_faults(run)
    assert [p.index for p in plan] == [0, 1, 2, 3, 4] and [p.kind for p in plan[:3]] == ["kill-rank"] * 3
    assert len({p.delay_s for p in plan[:3]}) == 3  # each repeat draws afresh
    assert plan[3].delay_s == 2 and plan[3].ranks == (3,) and plan[3].signal == "SIGTERM"
    assert plan[3].target == "rank 3 (SIGTERM)" and "rank" not in plan[3].options
    assert plan[4].at_step == 30 and len(plan[4].ranks) == 2 and plan[4].options["duration_s"] == 1


def test_a_step_beyond_the_run_or_a_kind_off_its_backend_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="fires at step 900, but the run trains 200 steps"):
        _run(tmp_path, [{"after": {"at_step": 900}}])
    with pytest.raises(SpecError, match="cannot repeat"):
        _run(tmp_path, [{"after": {"at_step": 20}, "repeat": 2}])
    with pytest.raises(SpecError, match=r"at_step is a training step: it takes no anchor \('ranks_started'\)"):
        _run(tmp_path, [{"after": {"at_step": 20}, "anchor": "ranks_started"}])
