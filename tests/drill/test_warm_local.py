"""restart.strategy warm on the local backend (issue 12), drilled through the real CLI with
experiments/campaigns/warm.yaml: twelve rank SIGKILLs at random moments over two runs (2 and 3
ranks), each answered in the same job by a warm spare that takes the dead rank's place and a
survivor's state; every run ends bit for bit as its fault-free twin (nothing of a dropped step
reached the weights) and no process of the drill is left behind. CI drills the 3-rank run with
three kills (two survivors each time: the one furthest on sends its state; PyTorch's warm
spares are CI's on a real cluster too: tests/cluster/test_warm_slurm.py); both runs and six kills
each with FAULTDRILL_FULL=1."""

from __future__ import annotations

from pathlib import Path

import yaml
from recovery_checks import assert_phases_follow_the_moments

from drills import drill, drill_processes
from faultdrill_cli import campaign_copy, full_campaigns


def test_every_sigkill_is_answered_by_a_warm_spare_and_every_run_ends_as_its_twin(tmp_path: Path) -> None:
    spec = campaign_copy("warm", tmp_path)
    full = full_campaigns()
    ranks = [2, 3] if full else [3]
    data = yaml.safe_load(spec.read_text())
    data["sweep"]["grid"]["resources.tasks_per_node"] = ranks
    kills = data["faults"][0]["repeat"] if full else 3
    data["faults"][0]["repeat"] = kills
    spec.write_text(yaml.safe_dump(data))
    report = drill(spec, timeout=900)
    faulted = [run for run in report["runs"] if not run["is_baseline"]]
    assert sorted(run["ranks"] for run in faulted) == ranks
    faults = [fault for run in faulted for fault in run["faults"]]
    assert len(faults) >= (kills - 1) * len(ranks) and all(fault["outcome"] == "injected" for fault in faults), faults
    for run in faulted:
        assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
        assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every re-formation in the same job"
        assert len(run["recoveries"]) == len(run["faults"]) == len(run["attempts"]) - 1
        for recovery in run["recoveries"]:
            assert recovery["strategy"] == "warm" and recovery["failure_class"] == "RANK_SIGNAL", recovery
            assert recovery["state_source"] == "peer" and recovery["spare"].startswith("slot "), recovery
            assert recovery["lost_steps"] <= 1 and recovery["queue_s"] < 0.5, recovery
            assert_phases_follow_the_moments(run, recovery, tmp_path / "work" / "runs" / run["run_id"])
        assert not drill_processes(tmp_path / "work" / "runs" / run["run_id"]), "a warm process outlived its job"
