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

WORKLOAD = {"framework": "torch", "params": 200000, "steps": 2000, "seed": 5, "batch_size": 16}
RESTART = {"strategy": "in-allocation", "max_restarts": 3, "poll_interval_s": 0.05, "hang_timeout_s": 3.0,
           "checkpoint_timeout_s": 10.0, "relaunch_wait_s": 30}


def _drill(tmp_path: Path, fault: dict[str, Any], expect: int = 0, **restart: Any) -> dict[str, Any]:
    spec = write_spec(tmp_path, workload=WORKLOAD, faults=[fault], baseline=True, parallel_runs=2,
                      restart={**RESTART, **restart}, checkpoint={"every_steps": 500, "keep": 3})
    return drill(spec, timeout=600, expect=expect)


@pytest.mark.parametrize("fault,failure_class", [
    ({"kind": "kill-rank", "after": {"at_step": 700}, "rank": 1, "signal": "SIGKILL"}, "RANK_SIGNAL"),
    ({"kind": "hang-rank", "after": {"at_step": 700}, "rank": 1}, "HANG"),
])
def test_the_ranks_start_again_in_the_same_job(tmp_path: Path, fault: dict[str, Any], failure_class: str) -> None:
    report = _drill(tmp_path, fault)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["identical_to_baseline"] is True
    assert len(run["attempts"]) == 2, [(a["state"], a["reason"]) for a in run["attempts"]]
    failed, relaunched = run["attempts"]
    assert failed["job_id"] == relaunched["job_id"], "no new job: the same job started its ranks again"
    assert failed["state"] == "STEP_FAILED" and failed["failure_class"] == failure_class
    [recovery] = run["recoveries"]
    assert recovery["strategy"] == "in-allocation" and recovery["resumed_from_step"] == 500
    assert_phases_follow_the_moments(run, recovery, tmp_path / "work" / "runs" / "r000")
    assert [row["strategy"] for row in report["strategies"]] == ["in-allocation"]


def test_a_run_that_gives_up_ends_its_job(tmp_path: Path) -> None:
    report = _drill(tmp_path, {"kind": "kill-rank", "after": {"at_step": 700}, "rank": 1, "signal": "SIGKILL"},
                    expect=1, max_restarts=0)
    assert run_of(report, "r000")["status"] == "gave_up"
    assert not drill_processes(tmp_path / "work" / "runs" / "r000"), "the job waited for a go that never came"
