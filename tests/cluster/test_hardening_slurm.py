"""Issue 7's scheduler-facing defects, on the real 2-node Slurm cluster: a stale attempt's job starts
nothing and is not requeued (item 1), duplicates of an attempt are found and cancelled (item 2), a
refused or half-accepted sbatch stays that run's problem (item 3), a multi-cluster id keeps its
cluster and a suspended job is no hang (item 10), parallel_runs holds with submit_as_array (item 11),
and extra directives reach sbatch as written (item 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from drills import api_workload
from experiments.layout import RunPaths, read_json_lines
from experiments.runtime.fence import Fence, write_fence
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import load_campaign, parse_campaign
from orchestrator.control.controller import Controller
from orchestrator.control.tracker import RunTracker
from orchestrator.render.scripts import attempt_job_name, render_slurm

DRILL_TIMEOUT_S = 600
CLUSTER_NAME = "faultdrill"  # scripts/cluster's ClusterName


def _spec(shared_tmp: Path, **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "slurm-hardening", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": api_workload(80),  # framework-free ranks: the controller's bookkeeping is drilled
        "checkpoint": {"every_steps": 20, "keep": 2},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"},
        "restart": {"max_restarts": 1, "poll_interval_s": 0.1},
    }
    spec.update(overrides)
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _drill(spec: Path, env: dict[str, str] | None = None, expect: int = 0) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_S, env=env)
    assert done.returncode == expect, done.stderr[-4000:]
    return json.loads(done.stdout)


def _track_all(report: dict[str, Any], slurm) -> None:
    for run in report["runs"]:
        for attempt in run["attempts"]:
            if attempt["job_id"]:
                slurm.track(attempt["job_id"].split(";")[0])


# --- item 1 -------------------------------------------------------------------------------------


def test_a_stale_attempts_job_starts_no_rank_and_is_never_requeued(shared_tmp: Path, slurm) -> None:
    run = expand_runs(load_campaign(_spec(shared_tmp)))[0]
    script = render_slurm(run, attempt=0, drill_id="slurm-hardening-stale")
    write_fence(run.paths, Fence(1, None))  # the controller replaced attempt 0 with attempt 1
    run.paths.submitit.mkdir(parents=True)
    (run.paths.submitit / "stale.sh").write_text(script.text)
    job_id = slurm.sbatch("stale.sh", cwd=run.paths.submitit)
    info = slurm.job_info(job_id)
    assert info.get("Requeue") == "0", "a Faultdrill job must not be requeued by Slurm (JobRequeue=1 default)"
    record = slurm.wait_sacct_state(job_id, timeout=60)
    assert record["State"] == "COMPLETED"
    log = (run.paths.submitit / f"{job_id}_batch.err").read_text()
    assert f"stale attempt: attempt 0 (job {job_id})" in log and "no rank started" in log
    assert not run.paths.attempt_dir(0).exists() and not run.paths.heartbeats.exists()
    requeue = slurm.run(["scontrol", "requeue", job_id], check=False)
    assert requeue.returncode != 0


# --- item 2 -------------------------------------------------------------------------------------


def test_duplicate_jobs_of_an_unrecorded_attempt_are_found_and_the_later_ones_cancelled(shared_tmp: Path,
                                                                                         slurm) -> None:
    campaign = load_campaign(_spec(shared_tmp))
    controller = Controller(campaign)
    run = controller.runs[0]
    try:
        with ThreadPoolExecutor(1) as pool:
            tracker = RunTracker(run, [], controller.backend, controller.ledger, pool, controller.drill_id)
            tracker.begin_attempt(0)
            name = attempt_job_name(run, 0, controller.drill_id)
            # Two jobs under the attempt's name (a submission that timed out and was sent again).
            first = slurm.sbatch("--hold", "-J", name, "-p", "debug", "-o", "/dev/null", "--wrap", "sleep 300")
            second = slurm.sbatch("--hold", "-J", name, "-p", "debug", "-o", "/dev/null", "--wrap", "sleep 300")
            tracker.start(time.time())  # a restarted controller picking up the unrecorded attempt
            assert tracker.job_id == first
            [attempt] = controller.ledger.attempts(run.run_id)
            assert attempt.job_id == first
            assert slurm.wait_sacct_state(second, timeout=60)["State"].startswith("CANCELLED")
            assert slurm.job_state(first) == "PENDING"
    finally:
        controller.close()


# --- items 3 and 10 -----------------------------------------------------------------------------


def _sbatch_that_fails_after_submitting(shared_tmp: Path) -> dict[str, str]:
    """An sbatch that submits for real, then fails once, as one whose reply timed out does."""
    bin_dir = shared_tmp / "bin"
    bin_dir.mkdir()
    marker = shared_tmp / "failed-once"
    shim = bin_dir / "sbatch"
    shim.write_text(f"""#!/bin/bash
out=$(/usr/bin/sbatch "$@") || {{ rc=$?; printf '%s\\n' "$out"; exit $rc; }}
if [ ! -e {marker} ]; then
  touch {marker}
  echo "sbatch: error: Socket timed out on send/recv operation" >&2
  exit 1
fi
printf '%s\\n' "$out"
""")
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_refused_sbatch_costs_that_run_only_and_a_half_accepted_one_is_not_sent_twice(shared_tmp: Path,
                                                                                        slurm) -> None:
    spec = _spec(shared_tmp, parallel_runs=2,
                 resources={"nodes": 1, "tasks_per_node": 2, "time": "00:10:00",
                            "extra_directives": [f"--clusters={CLUSTER_NAME}"]},
                 restart={"max_restarts": 1, "poll_interval_s": 0.1, "submit_retries": 1, "submit_backoff_s": 0.5},
                 sweep={"grid": {"resources.partition": ["debug", "nosuch"]}})
    report = _drill(spec, env=_sbatch_that_fails_after_submitting(shared_tmp), expect=1)
    _track_all(report, slurm)
    good = next(run for run in report["runs"] if run["run_id"].endswith("partition=debug"))
    bad = next(run for run in report["runs"] if run["run_id"].endswith("partition=nosuch"))
    assert good["status"] == "completed" and bad["status"] == "gave_up"
    # The site refuses that job as asked (no such partition): the run fails at once, no retry, no
    # restart (issue 22, item 6: it was tried and restarted until its budget was spent).
    assert [a["state"] for a in bad["attempts"]] == ["SUBMIT_FAILED"]
    assert "refused the job as asked" in bad["attempts"][0]["reason"]
    assert "Invalid partition" in bad["attempts"][0]["reason"]
    [attempt] = good["attempts"]
    assert attempt["job_id"].endswith(f";{CLUSTER_NAME}"), "the id lost the cluster sbatch chose"
    name = f"fd-{report['drill_id']}-{good['run_id']}-a0"
    slurm.wait_sacct_state(attempt["job_id"].split(";")[0], name_prefix=name)  # slurmdbd has the short job's record
    jobs = slurm.run(["sacct", "-M", CLUSTER_NAME, "-X", "-n", "-P", "-o", "JobID", "--name", name,
                      "-S", "now-1hour"]).stdout.split()
    assert jobs == [attempt["job_id"].split(";")[0]], f"the attempt went to Slurm {len(jobs)} times: {jobs}"


def test_a_job_suspended_longer_than_the_hang_timeout_is_not_taken_for_hung(shared_tmp: Path, slurm,
                                                                           wait_until) -> None:
    hang_timeout = 2.0
    spec = _spec(shared_tmp, workload=api_workload(300, step_s=0.05),  # 15 s at least, the suspension inside
                 restart={"max_restarts": 1, "poll_interval_s": 0.1, "hang_timeout_s": hang_timeout})
    paths = RunPaths(shared_tmp / "work" / "runs" / "r000")
    suspended: list[str] = []

    def suspend_for_a_while() -> None:
        wait_until(lambda: read_json_lines(paths.checkpoint_log), 180, message="the first checkpoint")
        job_id = json.loads(paths.rank_file(0, 0).read_text())["job_id"]
        slurm.run(["scontrol", "suspend", job_id])
        suspended.append(job_id)
        wait_until(lambda: slurm.job_state(job_id) == "SUSPENDED", 30, message="the job to be suspended")
        # Longer than the hang timeout, shorter than the ranks' own collective timeout (10 s),
        # which counts wall time too.
        time.sleep(2.5 * hang_timeout)
        slurm.run(["scontrol", "resume", job_id])

    suspender = threading.Thread(target=suspend_for_a_while)
    suspender.start()
    try:
        report = _drill(spec)
    finally:
        suspender.join()
    _track_all(report, slurm)
    run = report["runs"][0]
    assert suspended, "the job was never suspended"
    assert run["status"] == "completed" and len(run["attempts"]) == 1, run["attempts"]


# --- item 11 ------------------------------------------------------------------------------------


def test_submit_as_array_on_slurm_honours_parallel_runs(shared_tmp: Path, slurm) -> None:
    spec = _spec(shared_tmp, parallel_runs=1, submit_as_array=True,
                 workload=api_workload(40),
                 resources={"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"},
                 sweep={"grid": {"workload.seed": [1, 2]}})
    report = _drill(spec)
    _track_all(report, slurm)
    spans = []
    for run in report["runs"]:
        [attempt] = run["attempts"]
        record = slurm.wait_sacct_state(attempt["job_id"], timeout=60)
        assert record["State"] == "COMPLETED"
        times = slurm.run(["sacct", "-X", "-n", "-P", "-o", "Start,End", "-j", attempt["job_id"]]).stdout.split("|")
        spans.append(tuple(t.strip() for t in times))
    spans.sort()
    assert spans[1][0] >= spans[0][1], f"both runs ran at once with parallel_runs 1: {spans}"


# --- item 12 ------------------------------------------------------------------------------------


def test_extra_directives_with_values_reach_sbatch_as_written(shared_tmp: Path, slurm) -> None:
    campaign = parse_campaign(yaml.safe_load(_spec(shared_tmp).read_text()) | {
        "resources": {"nodes": 1, "tasks_per_node": 1, "partition": "debug",
                      "extra_directives": ["--comment fault drill note", "-c 2", "--hold"]}}, base_dir=shared_tmp)
    run = expand_runs(campaign)[0]
    run.paths.submitit.mkdir(parents=True)
    (run.paths.submitit / "held.sh").write_text(render_slurm(run, 0, "slurm-hardening-dirs").text)
    job_id = slurm.sbatch("held.sh", cwd=run.paths.submitit)
    info = slurm.job_info(job_id)
    assert slurm.job_state(job_id) == "PENDING" and info.get("Reason") == "JobHeldUser"
    shown = slurm.run(["scontrol", "show", "job", job_id]).stdout
    assert "Comment=fault drill note" in shown and "CPUs/Task=2" in shown
