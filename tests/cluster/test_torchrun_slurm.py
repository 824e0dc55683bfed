"""Issue 27, item 1 on the real Slurm cluster (and through its PBS commands): experiments/examples/torchrun_ddp.py (plain DDP,
``torch.save`` and a load of it, nothing of Faultdrill) under ``torchrun --nproc-per-node=2``, one
torchrun per node of a 2-node job (experiments/campaigns/example-torchrun-slurm.yaml). The ranks
are torchrun's workers, registered on their own nodes: a worker SIGKILLed, and a whole node crashed
(torchrun and its workers with it). The report's resumed step and lost steps are what the script's
own step log shows; no worker of the failed attempt outlives it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest
from step_logs import check_one_recovery, executed

from campaigns import campaign_copy, drill_report
from experiments.layout import RunPaths
from faultdrill_cli import FULL_ONLY

EVERY = 25  # the campaign's --every


def _drill(shared_tmp: Path, slurm: Any, fault: dict[str, Any], backend: str) -> tuple[dict[str, Any], RunPaths]:
    overrides: dict[str, Any] = {"faults": [fault]}
    if backend == "pbs":  # the same job through the PBS commands (its ranks' launch: one mpiexec task per node)
        overrides.update(backend="pbs", resources={"nodes": 2, "tasks_per_node": 2, "time": "00:15:00"})
    report = drill_report(campaign_copy("example-torchrun-slurm", shared_tmp, **overrides), timeout_s=600)
    [run] = report["runs"]
    for attempt in run["attempts"]:
        slurm.track(attempt["job_id"])
    return run, RunPaths(shared_tmp / "work" / "runs" / run["run_id"])


@pytest.mark.parametrize("backend,fault,failure_class", [
    ("slurm", {"kind": "kill-rank", "after": {"at_step": 80}, "rank": 3}, "RANK_SIGNAL"),
    pytest.param("slurm", {"kind": "node-crash", "after": {"at_step": 80}, "node": -1}, "NODE_FAIL", marks=FULL_ONLY),
    pytest.param("pbs", {"kind": "kill-rank", "after": {"at_step": 80}, "rank": 2}, "RANK_SIGNAL", marks=FULL_ONLY),
], ids=["slurm-worker-killed", "slurm-node-crashed", "pbs-worker-killed"])
def test_torchrun_workers_on_two_nodes_recover_as_their_own_log_says(
        shared_tmp: Path, cluster: Any, slurm: Any, backend: str, fault: dict[str, Any], failure_class: str) -> None:
    run, paths = _drill(shared_tmp, slurm, fault, backend)
    assert run["status"] == "completed" and run["final_step"] == 200 and run["ranks"] == 4, run
    identities = [json.loads(paths.rank_file(0, rank).read_text()) for rank in range(4)]
    assert len({identity["node"] for identity in identities}) == 2, identities
    assert len({(identity["node"], identity["launcher_pid"]) for identity in identities}) == 2, "a torchrun per node"
    assert identities[0]["pid"] == executed(paths.root / "steps-0.log")[0].pid, "the registered worker is rank 0"
    check_one_recovery(run, paths.root, EVERY)
    assert run["recoveries"][0]["failure_class"] == failure_class, run["recoveries"]
    # The cluster's nodes share this machine's process table: the first attempt's workers are gone.
    alive = [identity["pid"] for identity in identities if psutil.pid_exists(identity["pid"])
             and psutil.Process(identity["pid"]).create_time() <= identity["create_time"] + 1]
    assert not alive, alive
    assert slurm.wait_sacct_state(run["attempts"][0]["job_id"])["State"].split()[0] in {"FAILED", "CANCELLED",
                                                                                          "NODE_FAIL"}


@FULL_ONLY  # CI: tests/drill/test_torchrun_elastic_local.py (two restarts, one node)
def test_elastic_torchrun_restarts_its_workers_on_both_nodes_in_the_job(shared_tmp: Path, cluster: Any, slurm: Any) -> None:
    """restart.strategy elastic on 2 nodes: a worker of the second node killed; both nodes' torchruns
    start their workers again (the other's agent under its old restart count), each node's
    supervisor sees the new round as attempt 1, and the job completes as that attempt."""
    report = drill_report(campaign_copy("example-torchrun-slurm", shared_tmp,
                                        restart={"strategy": "elastic", "max_restarts": 2, "poll_interval_s": 0.2}),
                          timeout_s=600)
    [run] = report["runs"]
    for attempt in run["attempts"]:
        slurm.track(attempt["job_id"])
    paths = RunPaths(shared_tmp / "work" / "runs" / run["run_id"])
    assert run["status"] == "completed" and run["final_step"] == 200, run
    assert [a["job_id"] for a in run["attempts"]] == [run["attempts"][0]["job_id"]] * 2, run["attempts"]
    assert run["attempts"][0]["failure_class"] == "RANK_SIGNAL", run["attempts"]
    check_one_recovery(run, paths.root, EVERY)
    for rank in range(4):  # every rank's round 1 is registered under attempt 1, on its own node
        round_pids = [step.pid for step in executed(paths.root / f"steps-{rank}.log")]
        assert json.loads(paths.rank_file(1, rank).read_text())["pid"] == round_pids[-1], rank
    assert slurm.wait_sacct_state(run["attempts"][0]["job_id"])["State"].split()[0] == "COMPLETED"
