"""Runs in flight past 64 (issue 29): bounded by the site's limit, not by the spec; the local
backend's default follows the cores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_scheduler import FakeScheduler
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import MAX_PARALLEL_RUNS, Campaign, SpecError, load_campaign
from orchestrator.control.controller import Controller, local_parallel_runs, parallel_runs_of

pytestmark = pytest.mark.unit


def _spec(tmp_path: Path, backend: str, runs: int = 1, tasks_per_node: int = 1, **extra: Any) -> Path:
    """A small spec; ``runs`` > 1: a sweep over seeds (or ``sweep=`` given in ``extra``)."""
    spec = {
        "name": "wide", "backend": backend, "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50},
        "resources": {"nodes": 1, "tasks_per_node": tasks_per_node, "time": "00:10:00"},
        "restart": {"max_restarts": 1, "poll_interval_s": 0.01},
        **extra,
    }
    if runs > 1:
        spec["sweep"] = {"grid": {"workload.seed": list(range(runs))}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_five_hundred_in_flight_on_slurm_are_valid_and_the_sites_limit_binds_them(tmp_path: Path) -> None:
    spec = load_campaign(_spec(tmp_path, "slurm", runs=600, parallel_runs=500, submit_as_array=True))
    assert spec.parallel_runs == 500
    controller = Controller(spec, backend=FakeScheduler(max_array=1000, max_submit=300))
    try:
        assert controller.in_flight_limit == 300
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())  # one round
        notes = controller.ledger.meta("site_notes")
    finally:
        controller.close()
    assert notes and "MaxSubmitJobs: 300)" in notes[0] and "parallel_runs 500" in notes[0], notes


def test_without_a_site_limit_every_one_goes_out_in_one_array_throttled_to_parallel_runs(tmp_path: Path) -> None:
    scheduler = FakeScheduler(max_array=1000)
    controller = Controller(load_campaign(_spec(tmp_path, "slurm", runs=600, parallel_runs=500, submit_as_array=True)),
                            backend=scheduler)
    try:
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
    finally:
        controller.close()
    assert [len(array) for array in scheduler.called("submit_array")] == [600] and scheduler.throttles == [500]


def test_past_the_sanity_bound_is_refused_naming_the_field_and_the_bound(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"parallel_runs[\s\S]*100000"):
        load_campaign(_spec(tmp_path, "slurm", parallel_runs=MAX_PARALLEL_RUNS + 1))
    assert not (tmp_path / "work").exists()


def _in_flight(path: Path) -> int:
    campaign = load_campaign(path)
    return parallel_runs_of(campaign, expand_runs(campaign))


def test_slurm_and_pbs_keep_one_run_in_flight_unless_told(tmp_path: Path) -> None:
    assert _in_flight(_spec(tmp_path, "slurm")) == 1
    assert _in_flight(_spec(tmp_path, "pbs")) == 1
    assert _in_flight(_spec(tmp_path, "slurm", parallel_runs=3)) == 3


def test_the_local_default_is_a_run_per_two_cores_for_each_rank_of_the_largest_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert _in_flight(_spec(tmp_path, "local")) == 8
    assert _in_flight(_spec(tmp_path, "local", tasks_per_node=2)) == 4
    assert _in_flight(_spec(tmp_path, "local", tasks_per_node=2, parallel_runs=6)) == 6  # said: kept
    # Review: a sweep whose runs differ in size is sized by its largest (8 ranks: one at a time on 16 cores)
    assert _in_flight(_spec(tmp_path, "local", sweep={"grid": {"resources.tasks_per_node": [1, 8]}})) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert _in_flight(_spec(tmp_path, "local", tasks_per_node=4)) == 1  # never none


def test_an_unsaid_parallel_runs_stays_unsaid_in_the_spec_a_workdir_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: the default filled into the spec made a resume on a machine (or an allocation) with
    other cores a different spec, which the workdir refused."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    first = load_campaign(_spec(tmp_path, "local")).model_dump()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert load_campaign(_spec(tmp_path, "local")).model_dump() == first and first["parallel_runs"] is None


@pytest.mark.parametrize(("ranks", "cores", "runs"), [(1, 2, 1), (1, 3, 1), (1, 4, 2), (2, 16, 4), (3, 16, 2), (9, 16, 1)])
def test_local_parallel_runs(ranks: int, cores: int, runs: int) -> None:
    assert local_parallel_runs(ranks, cores) == runs


def _grid_values_copied(tmp_path: Path, runs: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """The sweep values the spec's dumps carried while the sweep's runs were made."""
    copied = 0
    dump = Campaign.model_dump

    def counting(self: Campaign, *args: Any, **kwargs: Any) -> dict[str, Any]:
        nonlocal copied
        data = dump(self, *args, **kwargs)
        grid = data.get("sweep", {}).get("grid", {})
        copied += sum(len(values) for grid in (grid if isinstance(grid, list) else [grid]) for values in grid.values())
        return data

    campaign = load_campaign(_spec(tmp_path / str(runs), "slurm", runs=runs))
    monkeypatch.setattr(Campaign, "model_dump", counting)
    assert len(expand_runs(campaign)) == runs
    monkeypatch.undo()
    return copied


def test_a_sweeps_runs_are_made_without_a_copy_of_its_grid_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each point's spec was a dump of the whole spec, its grid with it: 10,000 points copied 10^8
    values (4.6 s of a 10,000-run sweep's set-up). The copies now grow as the points do."""
    (tmp_path / "100").mkdir()
    (tmp_path / "400").mkdir()
    small, large = _grid_values_copied(tmp_path, 100, monkeypatch), _grid_values_copied(tmp_path, 400, monkeypatch)
    assert large <= 4.5 * max(small, 100), (small, large)


def test_a_grid_over_the_sweep_itself_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Review of issue 29's expansion: a grid key under sweep.* was overwritten silently, then (each
    point made without its sweep) refused as "no key 'sweep'"; it says what is wrong now."""
    with pytest.raises(SpecError, match=r"sweep.grid.sweep.grid: a grid cannot sweep the sweep itself"):
        expand_runs(load_campaign(_spec(tmp_path, "slurm", sweep={"grid": {"sweep.grid": [{}, {}]}})))
