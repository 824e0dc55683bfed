"""in-allocation relaunches in the job that is there only where it can: a hang's node that the
policy keeps the next attempt off (exclude_node, the default for HANG) leaves a 2-node job without
spare nodes too few to launch on; each relaunch failed at once ("Are required nodes explicitly
excluded?"), 10 attempts in 5 s, and the run gave up (the soak of issue 21). It takes a new job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.layout import RankIdentity, RunPaths, record_dict
from fake_scheduler import FakeScheduler, rank_fell_silent, when_first_job_runs
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller

pytestmark = pytest.mark.unit


def _spec(tmp_path: Path, spare_nodes: int) -> Path:
    spec = {
        "name": "relaunch-or-new", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "spare_nodes": spare_nodes},
        "restart": {"strategy": "in-allocation", "max_restarts": 2, "poll_interval_s": 0.01, "hang_timeout_s": 0.2},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _hang_on_node_n2(run_dir: Path) -> None:
    """Rank 0 of attempt 0, registered on node n2, falls silent."""
    paths = RunPaths(run_dir)
    paths.rank_file(0, 0).parent.mkdir(parents=True, exist_ok=True)
    paths.rank_file(0, 0).write_text(json.dumps(record_dict(RankIdentity(
        rank=0, pid=1, create_time=0.0, host="n2", node="n2", job_id="101", attempt=0))))
    rank_fell_silent(run_dir, 0, silent_s=5.0)


@pytest.mark.parametrize("spare_nodes, relaunched", [(0, False), (1, True)])
def test_a_relaunch_the_excluded_nodes_leave_no_room_for_takes_a_new_job(
        tmp_path: Path, spare_nodes: int, relaunched: bool) -> None:
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path, spare_nodes)), backend=scheduler)
    [run] = controller.runs
    hang = when_first_job_runs(scheduler, lambda job: _hang_on_node_n2(run.paths.root))
    rounds: list[int] = []

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        hang(trackers, touched)
        if len(controller.ledger.attempts(run.run_id)) >= 2:
            rounds.append(1)
            if len(rounds) > 20:
                controller.stop_requested.set()

    try:
        controller.run(observer=observe)
        [failed, attempt] = controller.ledger.attempts(run.run_id)[:2]
    finally:
        controller.close()
    assert failed.failure_class == "HANG" and failed.failed_nodes == "n2" and attempt.excluded_nodes == "n2"
    if relaunched:  # a spare node takes n2's place: the same job
        assert attempt.job_id == failed.job_id and scheduler.called("submit") == [(run.run_id, 0)]
    else:  # the hung job cancelled as the drill's; the next attempt in a new job, off n2
        assert attempt.job_id != failed.job_id and scheduler.called("submit") == [(run.run_id, 0), (run.run_id, 1)]
        assert failed.job_id in scheduler.called("cancel")


@pytest.mark.parametrize("lost, new_job", [(["n2"], False), (["n2", "n3"], True)])
def test_a_job_that_lost_more_nodes_than_it_has_to_spare_is_not_relaunched_in(
        tmp_path: Path, lost: list[str], new_job: bool) -> None:
    """Issue 24: in-allocation with one spare node and two node crashes in the same job. The next
    attempt stays off the newest dead node only (max_excluded_nodes 1), but both dead nodes stay in
    the allocation: each relaunch failed at once ("Requested node configuration is not available")
    until the restart budget was spent (bench/ttr.py). Two nodes lost, one to spare: a new job."""
    controller = Controller(load_campaign(_spec(tmp_path, spare_nodes=1)), backend=FakeScheduler())
    [run] = controller.runs
    pools = controller.injector_pools()
    try:
        [tracker] = controller.trackers(pools)
        for attempt, node in enumerate(lost):
            controller.ledger.add_attempt(run.run_id, attempt, "fd-job", None)
            controller.ledger.update_attempt(run.run_id, attempt, job_id="101", failure_class="NODE_FAIL",
                                             failed_nodes=node)
        why = tracker._why_no_relaunch(len(lost), 0.0, "101")
    finally:
        for pool in pools.values():
            pool.shutdown()
        controller.close()
    assert (why is not None) is new_job, why
    if new_job:
        assert why is not None and "job 101 has lost n2, n3, more nodes than its 1 spare node(s)" in why
