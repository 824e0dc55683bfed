"""Issue 27, item 1: a plain DDP script under torchrun (experiments/examples/torchrun_ddp.py), drilled
as its user launches it (``command: [torchrun, --nproc-per-node=2, torchrun_ddp.py, ...]``). The ranks are torchrun's workers: a
kill-rank hits a worker (not torchrun, whose workers trained on before), or, with ``process:
launcher``, torchrun itself; either way no process of the killed attempt outlives it, and the
report's resumed step and lost steps are what the script's own per-step log shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
from step_logs import check_one_recovery, executed

from drills import drill
from faultdrill_cli import FULL_ONLY, campaign_copy

EVERY = 25  # the campaign's --every


def _drill_torchrun(tmp_path: Path, fault: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """experiments/campaigns/example-torchrun.yaml (experiments/examples/torchrun_ddp.py) with ``fault``."""
    report = drill(campaign_copy("example-torchrun", tmp_path, faults=[fault]), timeout=400)
    [run] = report["runs"]
    return run, tmp_path / "work" / "runs" / str(run["run_id"])


def _check_recovery(run: dict[str, Any], run_dir: Path) -> None:
    """The report against the script's own log; none of the killed attempt's workers alive; the
    workers, on one torchrun, are the ranks."""
    assert run["status"] == "completed", run
    check_one_recovery(run, run_dir, EVERY)
    identities = [json.loads(path.read_text()) for path in sorted((run_dir / "attempts" / "0").glob("rank-[0-9].json"))]
    assert sorted(identity["rank"] for identity in identities) == [0, 1]
    killed = {executed(run_dir / f"steps-{rank}.log")[0].pid for rank in (0, 1)}
    assert {identity["pid"] for identity in identities} == killed, "the workers are the ranks"
    assert len({identity["launcher_pid"] for identity in identities}) == 1
    assert not [pid for pid in killed if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@FULL_ONLY  # CI: tests/cluster/test_torchrun_slurm.py's worker kill
def test_a_kill_of_a_torchrun_worker_is_a_kill_of_that_rank(tmp_path: Path) -> None:
    run, run_dir = _drill_torchrun(tmp_path, {"kind": "kill-rank", "after": {"at_step": 60}, "rank": 1})
    _check_recovery(run, run_dir)
    [fault] = run["faults"]
    assert fault["target"].startswith("rank 1@") and fault["outcome"] == "injected", fault
    # torchrun exits 1 for its failed worker; the rank ends as that worker did: by SIGKILL.
    assert run["attempts"][0]["failure_class"] == "RANK_SIGNAL", run["attempts"]


@FULL_ONLY
def test_a_kill_of_torchrun_itself_ends_its_workers_with_it(tmp_path: Path) -> None:
    run, run_dir = _drill_torchrun(tmp_path, {"kind": "kill-rank", "after": {"at_step": 60}, "rank": 0,
                                              "process": "launcher"})
    _check_recovery(run, run_dir)
    [fault] = run["faults"]
    assert "launcher" in fault["detail"] and fault["outcome"] == "injected", fault
    assert run["attempts"][0]["failure_class"] == "RANK_SIGNAL", run["attempts"]
