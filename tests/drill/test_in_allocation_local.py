"""restart.strategy in-allocation on the local backend (issue 9): the job (submitit's local
controller) keeps running after its ranks failed, and on the controller's go starts them again as
the next attempt, in the same job; a hung rank's processes alone are killed; a run that gives up
ends its job. Real processes, real faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recovery_checks import assert_phases_follow_the_moments

from drills import drill, drill_processes, run_of, write_spec
from faultdrill_cli import FULL_ONLY

EVERY = 300  # checkpoints; the faults come at step 400, a paced step (step_s) before the next
WORKLOAD = {"framework": "torch", "params": 200000, "steps": 600, "step_s": 0.02, "seed": 5, "batch_size": 16}
RESTART = {"strategy": "in-allocation", "max_restarts": 3, "poll_interval_s": 0.05, "hang_timeout_s": 3.0,
           "checkpoint_timeout_s": 10.0, "relaunch_wait_s": 30}


FAULTS = {  # the failure class -> the fault that causes it; one run each, in one drill, sharing one twin
    "RANK_SIGNAL": {"kind": "kill-rank", "after": {"at_step": 400}, "rank": 1, "signal": "SIGKILL"},
    "HANG": {"kind": "hang-rank", "after": {"at_step": 400}, "rank": 1},
}


def _spec(tmp_path: Path, **overrides: Any) -> Path:
    sections = {"workload": WORKLOAD, "restart": RESTART, "checkpoint": {"every_steps": EVERY, "keep": 3}}
    return write_spec(tmp_path, **{**sections, **overrides})


@pytest.fixture(scope="module")
def relaunched(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One drill: a run per fault of FAULTS (r000, r001, in that order) and their fault-free twin."""
    tmp_path = tmp_path_factory.mktemp("in-allocation")
    spec = _spec(tmp_path, baseline=True, parallel_runs=3, sweep={"grid": {"faults": [[f] for f in FAULTS.values()]}})
    return drill(spec, timeout=600), tmp_path / "work"


# CI: in-allocation's relaunch on the Slurm cluster (tests/cluster/test_strategies.py: a kill, a node
# crash) and through PBS (tests/cluster/test_pbs_drill.py: a kill, then a hang the agent ends).
@FULL_ONLY
@pytest.mark.parametrize("run_id,failure_class", [("r000", "RANK_SIGNAL"), ("r001", "HANG")])
def test_the_ranks_start_again_in_the_same_job(relaunched: tuple[dict[str, Any], Path], run_id: str,
                                               failure_class: str) -> None:
    report, workdir = relaunched
    run = run_of(report, run_id)
    assert run["faults"][0]["kind"] == FAULTS[failure_class]["kind"], run["faults"]
    assert run["status"] == "completed" and run["identical_to_baseline"] is True
    assert len(run["attempts"]) == 2, [(a["state"], a["reason"]) for a in run["attempts"]]
    failed, relaunched_attempt = run["attempts"]
    assert failed["job_id"] == relaunched_attempt["job_id"], "no new job: the same job started its ranks again"
    assert failed["state"] == "STEP_FAILED" and failed["failure_class"] == failure_class
    [recovery] = run["recoveries"]
    assert recovery["strategy"] == "in-allocation" and recovery["resumed_from_step"] == EVERY
    assert_phases_follow_the_moments(run, recovery, workdir / "runs" / run_id)
    rows = {(row["strategy"], row["failure_class"]) for row in report["strategies"]}
    assert rows == {("in-allocation", failure_class) for failure_class in FAULTS}, report["strategies"]


def test_a_run_that_gives_up_ends_its_job(tmp_path: Path) -> None:
    restart = {**RESTART, "max_restarts": 0}
    report = drill(_spec(tmp_path, faults=[FAULTS["RANK_SIGNAL"]], restart=restart), timeout=600, expect=1)
    assert run_of(report, "r000")["status"] == "gave_up"
    assert not drill_processes(tmp_path / "work" / "runs" / "r000"), "the job waited for a go that never came"
