"""Issue 7 through the PBS commands on the local cluster (Slurm's Torque wrappers): a job array that a
stopped controller submitted but never recorded is adopted, not submitted again (item 2a), and
TensorFlow ranks on two nodes get every rank's address from the launch (item 14)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from drills import api_workload
from faultdrill_cli import full_campaigns
from orchestrator.backends.pbs.commands import qdel
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.control.tracker import RunTracker
from orchestrator.render.scripts import array_job_name

DRILL_TIMEOUT_S = 600


def _spec(shared_tmp: Path, **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "pbs-hardening", "backend": "pbs", "workdir": str(shared_tmp / "work"),
        "workload": api_workload(40),  # framework-free ranks (the TensorFlow test names its own)
        "checkpoint": {"every_steps": 20, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"max_restarts": 1, "poll_interval_s": 0.1},
    }
    spec.update(overrides)
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _drill(spec: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_an_array_submitted_by_a_stopped_controller_is_adopted_not_submitted_again(shared_tmp: Path) -> None:
    # 12 s of steps: the stopped controller's array is still in qstat when the next drill looks for it
    # (at 10 ms a step its first elements had ended and left qstat first on a loaded machine: nothing
    # to adopt, the runs' own files said they were complete).
    spec = _spec(shared_tmp, submit_as_array=True, parallel_runs=2, sweep={"grid": {"workload.seed": [1, 2, 3]}},
                 workload=api_workload(40, step_s=0.3))
    controller = Controller(load_campaign(spec))
    runs = controller.runs
    name = array_job_name(runs, 0, controller.drill_id)
    # What the controller does up to qsub's answer, then a stop: the array is queued, no id recorded.
    with ThreadPoolExecutor(1) as pool:
        trackers = [RunTracker(run, [], controller.backend, controller.ledger, pool, controller.drill_id)
                    for run in runs]
        jobs = [tracker.begin_attempt(0, name, index) for index, tracker in enumerate(trackers)]
        submitted = controller.backend.submit_array([(run, job) for run, job in zip(runs, jobs, strict=False)])
    controller.close()
    array_ids = {submission.job_id.split("[")[0] for submission in submitted}
    try:
        report = _drill(spec)
        assert all(run["status"] == "completed" for run in report["runs"])
        job_ids = [attempt["job_id"] for run in report["runs"] for attempt in run["attempts"]]
        assert job_ids == [submission.job_id for submission in submitted], "the runs were submitted again"
        queued = subprocess.run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%F"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.split()
        assert set(queued) == array_ids, "another array of these runs reached the scheduler"
    finally:
        for array_id in array_ids:
            qdel(array_id, None)


def test_tensorflow_ranks_on_two_nodes_through_pbs_recover_from_a_kill(shared_tmp: Path, cluster) -> None:
    # CI: a rank a node (the addresses cross nodes all the same, at half the TensorFlow start-ups,
    # each ~7 s of CPU on this host); FAULTDRILL_FULL=1: two a node, a host's second slot and port and
    # the node file's block order run too (in CI, unit tests: test_tf_cluster.py, the pbs.j2 awk).
    per_node = 2 if full_campaigns() else 1
    ranks = 2 * per_node
    spec = _spec(shared_tmp, workload={"framework": "tensorflow", "params": 2000, "steps": 150, "seed": 4,
                                       "batch_size": 16},
                 resources={"nodes": 2, "tasks_per_node": per_node, "time": "00:10:00"},
                 faults=[{"kind": "kill-rank", "after": {"fixed": 0.5}, "anchor": "first_checkpoint",
                          "rank": ranks - 1}],
                 restart={"max_restarts": 2, "poll_interval_s": 0.2})
    report = _drill(spec)
    run = report["runs"][0]
    try:
        assert run["status"] == "completed" and run["final_step"] == 150
        assert run["faults"][0]["outcome"] == "injected" and run["recoveries"]
        assert run["recoveries"][0]["resumed_from_step"] > 0
        node_of = {json.loads((shared_tmp / "work" / "runs" / "r000" / "attempts" / "0" / f"rank-{rank}.json")
                              .read_text())["node"] for rank in range(ranks)}
        assert len(node_of) == 2 and node_of <= set(cluster), node_of
    finally:
        for attempt in run["attempts"]:
            qdel(attempt["job_id"], None)
