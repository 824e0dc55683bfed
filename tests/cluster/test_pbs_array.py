"""Job arrays through PBS on the local cluster: 20 points as ONE array with a throttle through
``submitit.AutoExecutor(folder, cluster="pbs")`` (map_array and submit_array), and the backend's
``submit_array`` of several runs' first attempts."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

from conftest import most_at_once
from drills import api_workload
from experiments.layout import RankJob
from experiments.runtime.fence import Fence, write_fence
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.pbs.commands import SCHEDULER_ID_FILE, ServerKind, qstat_records, read_job_file
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign

POINTS = 20
THROTTLE = 5
RESULT_TIMEOUT_S = 240

# The jobs unpickle functions of this module, which the ranks cannot import by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def timed_square(value: int) -> tuple[int, float, float]:
    started = time.time()
    time.sleep(1.0)
    return value * value, started, time.time()


@pytest.mark.parametrize("flavor", ["torque", "pro"])
def test_twenty_points_run_as_one_throttled_array(shared_tmp: Path, cluster, slurm, wait_until,
                                                  flavor: str) -> None:
    executor = submitit.AutoExecutor(folder=shared_tmp / "logs", cluster="pbs")
    name = f"fd-array-{flavor}-{shared_tmp.name[-8:]}"
    executor.update_parameters(name=name, timeout_min=10, pbs_flavor=flavor, pbs_array_parallelism=THROTTLE)
    jobs = executor.map_array(timed_square, range(POINTS))
    array_id = jobs[0].job_id.split("[", 1)[0]
    assert [job.job_id for job in jobs] == [f"{array_id}[{index}]" for index in range(POINTS)]
    slurm.track(array_id)

    deadline = time.time() + RESULT_TIMEOUT_S
    results = [job.result() for job in jobs if time.time() < deadline]
    assert [value for value, _, _ in results] == [index * index for index in range(POINTS)]
    assert most_at_once([(start, end) for _, start, end in results]) <= THROTTLE

    def all_completed() -> bool:  # the results exist before each element's batch script has ended
        jobs[0].watcher.update()  # one qstat -f for all twenty
        return all(job.watcher.get_state(job.job_id, mode="cache") == "COMPLETED" for job in jobs)

    wait_until(all_completed, timeout=60, interval=0.5, message="qstat to show every element COMPLETED")

    # One array to qstat: every element's own record carries the array's name; Slurm's accounting
    # underneath lists the 20 elements under the one array id that qsub printed.
    folder = shared_tmp / "logs"
    element_ids = [read_job_file(folder, SCHEDULER_ID_FILE, job.job_id) for job in jobs]
    records = qstat_records([str(job_id) for job_id in element_ids], ServerKind.SLURM_WRAPPERS)
    assert len(records) == POINTS and {record["Job_Name"] for record in records.values()} == {name}
    expected = sorted(f"{array_id}_{index}" for index in range(POINTS))

    def accounted() -> bool:  # slurmdbd takes a moment to hold every record
        listed = slurm.run(["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobID"]).stdout.split()
        return sorted(listed) == expected

    wait_until(accounted, timeout=60, interval=0.5, message=f"sacct to list {expected}")


def test_submit_array_of_partials(shared_tmp: Path, cluster, slurm) -> None:
    executor = submitit.AutoExecutor(folder=shared_tmp / "logs", cluster="pbs")
    executor.update_parameters(timeout_min=10, pbs_array_parallelism=3)
    jobs = executor.submit_array([functools.partial(pow, base, 2) for base in range(6)])
    slurm.track(jobs[0].job_id.split("[", 1)[0])
    assert [job.result() for job in jobs] == [base ** 2 for base in range(6)]


def test_backend_submits_first_attempts_as_one_array(shared_tmp: Path, cluster, slurm) -> None:
    campaign = Campaign.model_validate({
        "name": "pbs-array", "backend": "pbs", "workdir": str(shared_tmp / "work"), "parallel_runs": 2,
        "workload": api_workload(20),  # framework-free ranks: the array is what is drilled
        "checkpoint": {"every_steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "sweep": {"grid": {"workload.seed": [1, 2, 3]}},
    })
    runs = expand_runs(campaign)
    backend = PBSBackend("pbs-array-test")
    for run in runs:  # as the tracker does before it submits: a drill's rank with no fence refuses to run
        run.paths.root.mkdir(parents=True, exist_ok=True)
        write_fence(run.paths, Fence(0, None, "pbs-array-test"))
    items = [(run, RankJob(run_id=run.run_id, run_dir=str(run.paths.root), attempt=0, workload=run.workload,
                           checkpoint_every=10, checkpoint_keep=2, drill_id="pbs-array-test")) for run in runs]
    submissions = backend.submit_array(items)
    array_id = submissions[0].job_id.split("[", 1)[0]
    slurm.track(array_id)
    assert [s.job_id for s in submissions] == [f"{array_id}[{index}]" for index in range(3)]

    job_ids = [s.job_id for s in submissions]
    deadline = time.time() + RESULT_TIMEOUT_S
    states = backend.poll(job_ids)
    while not all(state.is_terminal for state in states.values()) and time.time() < deadline:
        time.sleep(0.5)
        states = backend.poll(job_ids)
    assert {state.value for state in states.values()} == {"COMPLETED"}, states
    for run in runs:
        assert json.loads(run.paths.final.read_text())["step"] == 20
        assert json.loads(run.paths.rank_file(0, 0).read_text())["job_id"].startswith(array_id)
