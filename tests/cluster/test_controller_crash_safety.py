"""Issue 9's crash safety on the real cluster: the controller SIGKILLed three times at random moments
of one Slurm drill and started again with the same command submits no attempt twice and loses no
ledger row (sacct shows one job per attempt); slurmctld stopped for 20 s in the middle of a drill
is waited out (states unknown, never failure), and past restart.scheduler_timeout_s the drill stops
with a clear error, leaving its job for the next drill to adopt."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from drills import api_workload

DRILL = [sys.executable, "-m", "orchestrator.cli", "drill"]
DRILL_TIMEOUT_S = 600
CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"


def _spec(shared_tmp: Path, file: str = "spec.yaml", **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "slurm-crash-safety", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 300, "seed": 5, "batch_size": 16},
        "checkpoint": {"every_steps": 25, "keep": 2},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"},
        "restart": {"max_restarts": 3, "poll_interval_s": 0.2},
    }
    spec.update(overrides)
    path = shared_tmp / file
    path.write_text(yaml.safe_dump(spec))
    return path


def _start(spec: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([*DRILL, str(spec), "--format", "json"], stdout=subprocess.PIPE, stderr=out)


def _finish(drill: subprocess.Popen[bytes], expect: int = 0, timeout_s: float = DRILL_TIMEOUT_S) -> dict[str, Any]:
    stdout, _ = drill.communicate(timeout=timeout_s)
    assert drill.returncode == expect, f"drill exited {drill.returncode}"
    return json.loads(stdout) if expect == 0 else {}


def _ledger_attempts(workdir: Path) -> list[tuple[str, int, str | None]]:
    with sqlite3.connect(workdir / "ledger.sqlite") as db:
        return db.execute("SELECT run_id, attempt, job_id FROM attempts ORDER BY run_id, attempt").fetchall()


def _drill_id(workdir: Path) -> str:
    with sqlite3.connect(workdir / "ledger.sqlite") as db:
        return json.loads(db.execute("SELECT value FROM meta WHERE key = 'drill_id'").fetchone()[0])


def _sacct_jobs(drill_id: str, since: str) -> dict[str, list[str]]:
    """Job name -> the job ids Slurm accounted under it, for the drill's jobs."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName%200", "-S", since],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    jobs: dict[str, list[str]] = {}
    for line in out.splitlines():
        job_id, _, name = line.partition("|")
        if drill_id in name:
            jobs.setdefault(name, []).append(job_id)
    return jobs


def _training(workdir: Path) -> bool:
    """Some run of the drill has taken a training step (its heartbeats are there)."""
    return any((workdir / "runs").glob("*/heartbeats/*"))


def _wait(condition: Any, what: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s:.0f} s: {what}")


def test_three_sigkills_of_the_controller_submit_nothing_twice_and_lose_no_row(shared_tmp: Path, slurm) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    fault = {"kind": "kill-rank", "after": {"fixed": 4.0}, "anchor": "first_checkpoint", "rank": 1, "signal": "SIGKILL"}
    # Long enough to outlive three kills at up to 8 s each (seed 983656985 drew 3.4, 5.6, 4.4 s, and the
    # drill had finished before the last start, which then began a new one: "changed job").
    workload = api_workload(300, step_s=0.12)  # framework-free ranks: the controller is what is drilled
    spec = _spec(shared_tmp, faults=[fault], baseline=True, parallel_runs=2, workload=workload)
    workdir, log = shared_tmp / "work", shared_tmp / "drill.log"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 5))
    moments = []
    for kill in range(3):
        drill = _start(spec, log)
        if kill == 0:
            _wait(lambda: (workdir / "ledger.sqlite").exists(), "the first controller starts", 60)
        moment = rng.uniform(0.5, 8.0)
        moments.append(round(moment, 2))
        time.sleep(moment)  # the moment of the SIGKILL, drawn: the test is about any moment
        drill.send_signal(signal.SIGKILL)
        drill.wait(timeout=30)
        rows_before = _ledger_attempts(workdir)
        for _, _, job_id in rows_before:
            if job_id:
                slurm.track(job_id)
    report = _finish(_start(spec, log))
    where = f"(seed {seed}, SIGKILLs {moments} s after each start; log {log})"

    runs = {run["run_id"]: run for run in report["runs"]}
    assert all(run["status"] == "completed" for run in runs.values()), where
    assert runs["r000"]["identical_to_baseline"] is True, where
    attempts = _ledger_attempts(workdir)
    final = {(run_id, attempt): job_id for run_id, attempt, job_id in attempts}
    for run_id, attempt, job_id in rows_before:  # a submission in flight gets its job id later
        assert (run_id, attempt) in final, f"ledger row {run_id}/{attempt} was lost {where}"
        assert job_id is None or final[(run_id, attempt)] == job_id, f"{run_id}/{attempt} changed job {where}"
    accounted = _sacct_jobs(_drill_id(workdir), since)
    duplicates = {name: ids for name, ids in accounted.items() if len(ids) > 1}
    assert not duplicates, f"an attempt was submitted twice: {duplicates} {where}"
    ledger_jobs = sorted(job_id.split(";")[0] for _, _, job_id in attempts if job_id)
    assert ledger_jobs == sorted(job for ids in accounted.values() for job in ids), where
    faults = runs["r000"]["faults"]
    # A SIGKILL while the agent acted leaves the fault "unknown"; one before it was due, "not fired".
    assert faults and faults[0]["outcome"] in ("injected", "unknown", "absorbed", "late", "not fired"), (faults, where)
    if faults[0]["outcome"] == "injected":
        [recovery] = runs["r000"]["recoveries"]
        assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["ttr_s"] > 0, where


def _cluster(action: str) -> str:
    return subprocess.run([str(CLUSTER_SCRIPT), action], capture_output=True, text=True, timeout=120,
                          check=True).stdout


# Long enough that the rank step ends well after slurmctld is back: a step that ends while it is
# down leaves a slurmstepd retrying its completion message, and Slurm drains the node ("Kill task
# failed") when the job's end comes first: 375 steps of at least 120 ms, 45 s or more whatever the
# machine's load (framework-free ranks: the controller and the scheduler are what is drilled).
LONG = api_workload(375, step_s=0.12)
OUTAGE_S = 12  # past the deadline drill's 6 s and its exit, short of the other's 60 s


def test_slurmctld_down_for_a_while_is_waited_out_and_past_its_deadline_named(shared_tmp: Path, slurm) -> None:
    """Two drills through one outage: one whose scheduler_timeout_s (60 s) outlasts it waits it out;
    one whose deadline (6 s) passes stops, names the scheduler, and leaves its job to the next
    drill, which adopts it."""
    waits = _spec(shared_tmp, workload=LONG, restart={"max_restarts": 1, "poll_interval_s": 0.2,
                                                      "scheduler_poll_s": 2, "scheduler_timeout_s": 60})
    gives_up = _spec(shared_tmp, name="slurm-ctld-deadline", workdir=str(shared_tmp / "work2"), workload=LONG,
                     restart={"max_restarts": 1, "poll_interval_s": 0.2, "scheduler_poll_s": 2,
                              "scheduler_timeout_s": 6}, file="deadline.yaml")
    workdir, workdir2 = shared_tmp / "work", shared_tmp / "work2"
    log, log2 = shared_tmp / "drill.log", shared_tmp / "deadline.log"
    waiting, stopping = _start(waits, log), _start(gives_up, log2)
    drills = [waiting, stopping]
    try:
        _outage_through(workdir, workdir2, stopping)
        adopting = _start(gives_up, log2)  # the next drill, while the job it adopts still trains
        drills.append(adopting)
        report = _finish(waiting)
        [run] = report["runs"]
        assert run["status"] == "completed" and run["final_step"] == LONG["steps"]
        assert len(run["attempts"]) == 1 and not run["attempts"][0]["reason"], "an outage is no failure"
        assert report["controller_cost"]["scheduler_poll_failures"] >= 1

        # Past the deadline: the drill stopped, named the scheduler, and left its job to the next drill.
        said = log2.read_text()
        assert "slurm) has not answered for" in said and "scheduler_timeout_s = 6" in said, said[-2000:]
        report = _finish(adopting)
        [(_, _, job_id)] = _ledger_attempts(workdir2)
        [run] = report["runs"]
        assert run["status"] == "completed" and [a["job_id"] for a in run["attempts"]] == [job_id]
    finally:
        for drill in drills:  # the controllers this test started, when an assertion left them running
            if drill.poll() is None:
                drill.kill()
                drill.wait(timeout=30)
        for ledger_dir in (workdir, workdir2):  # and their jobs, cancelled at the end if still there
            if (ledger_dir / "ledger.sqlite").exists():
                for _, _, job in _ledger_attempts(ledger_dir):
                    if job:
                        slurm.track(job)


def _outage_through(workdir: Path, workdir2: Path, stopping: subprocess.Popen[bytes]) -> None:
    """slurmctld down OUTAGE_S once both drills train; the deadline drill stops within it."""
    try:
        _wait(lambda: _training(workdir) and _training(workdir2), "both drills' runs train", 120)
        _cluster("ctld-stop")
        outage_end = time.monotonic() + OUTAGE_S
        _finish(stopping, expect=3, timeout_s=OUTAGE_S)  # within the outage: its deadline is 6 s
        time.sleep(max(0.0, outage_end - time.monotonic()))  # the rest of the outage: the scheduler is gone
    finally:
        _cluster("ctld-start")
