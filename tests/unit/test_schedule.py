"""Fault schedules: seeded, reproducible, within their bounds; targets within the run."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from injectors.ranks import RankFraction, choose_ranks
from injectors.schedule import DelayDistribution, seeded_rng
from orchestrator.controller import plan_faults
from orchestrator.runs import expand_runs
from orchestrator.spec import parse_campaign


def test_exponential_draws_repeat_for_the_same_seed_and_differ_for_another() -> None:
    dist = DelayDistribution(mean_s=4.0)
    first = [dist.draw(seeded_rng("a", 1)) for _ in range(3)]
    again = [dist.draw(seeded_rng("a", 1)) for _ in range(3)]
    other = dist.draw(seeded_rng("a", 2))
    assert first == again and other != first[0]


def test_exponential_mean_and_clipping() -> None:
    rng = seeded_rng("mean")
    draws = [DelayDistribution(mean_s=2.0).draw(rng) for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(2.0, rel=0.05)
    clipped = [DelayDistribution(mean_s=2.0, min_s=1.0, max_s=3.0).draw(rng) for _ in range(2000)]
    assert min(clipped) >= 1.0 and max(clipped) == 3.0


def test_fixed_delay() -> None:
    assert DelayDistribution(fixed_s=1.25).draw(seeded_rng()) == 1.25


def test_rank_choice_is_checked_against_the_world() -> None:
    rng = seeded_rng("r")
    assert {choose_ranks("random", 4, rng) for _ in range(200)} == {(0,), (1,), (2,), (3,)}
    assert choose_ranks([3, 1, 3], 4, rng) == (1, 3)
    halves = {choose_ranks(RankFraction(fraction=0.5), 4, rng) for _ in range(200)}
    assert all(len(ranks) == 2 and len(set(ranks)) == 2 for ranks in halves) and len(halves) > 1
    assert choose_ranks(RankFraction(fraction=0.01), 4, rng).__len__() == 1  # at least one rank
    with pytest.raises(ValueError, match="ranks 0..1"):
        choose_ranks(5, 2, rng)
    with pytest.raises(ValueError, match="ranks 0..1"):
        choose_ranks([0, 2], 2, rng)


def test_plan_is_reproducible_per_run(tmp_path: Path) -> None:
    raw = {"name": "p", "workdir": str(tmp_path / "w"), "resources": {"tasks_per_node": 4},
           "faults": [{"after": {"exponential": 5}}, {"after": {"fixed": 2}, "rank": 3, "signal": "TERM"}]}
    run = expand_runs(parse_campaign(raw, base_dir=tmp_path))[0]
    plan = plan_faults(run)
    assert plan == plan_faults(run)
    assert [p.index for p in plan] == [0, 1]
    assert plan[1].delay_s == 2 and plan[1].ranks == (3,) and plan[1].signal == "SIGTERM"
    assert plan[1].target == "rank 3 (SIGTERM)" and "rank" not in plan[1].options
    assert len(plan[0].ranks) == 1 and 0 <= plan[0].ranks[0] < 4
