"""Detached drills on the local backend (real processes): ``drill --detach`` returns while its
controller runs on, ``status`` shows it, a second controller on the same workdir is refused,
``stop`` leaves the jobs running for the next ``drill`` to adopt, ``cancel`` ends them and says so."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from drills import FAULTDRILL, api_workload, drill, drill_processes, kill_verified, run_of, write_spec
from faultdrill_cli import faultdrill, faultdrill_on, report, status
from orchestrator.control.detach import live_controller

# 40 s of training at least, past the commands a test gives meanwhile (framework-free ranks).
SLOW = api_workload(400, step_s=0.1)


def wait_for(condition: Any, what: str, deadline_s: float = 120.0) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s:.0f} s: {what}")


def alive(pid: int) -> bool:
    """Running (a zombie has ended: its new parent, init, reaps it when it will)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def training(workdir: Path) -> dict[str, Any] | None:
    """The status once every run's job is RUNNING and has taken steps."""
    now = status(workdir)
    runs = now["runs"]
    return now if runs and all(run["state"] == "RUNNING" and run["step"] > 0 for run in runs) else None


def test_a_detached_drill_is_watched_stopped_and_adopted_by_the_next_drill(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, workload=SLOW)
    workdir = tmp_path / "work"
    said = faultdrill("drill", str(spec), "--detach")
    assert "runs in the background" in said and f"faultdrill status {workdir}" in said
    try:
        running = wait_for(lambda: training(workdir), "the detached drill trains")
        assert running["controller"]["running"] is True
        controller = live_controller(workdir)
        assert controller is not None and alive(controller.pid)
        busy = faultdrill("drill", str(spec), expect=2)
        assert f"pid {controller.pid}" in busy and "already drives" in busy

        # From another login node (issue 22, item 11): the controller is seen where it runs, and
        # neither signalled by a pid that means nothing there nor joined by a second one.
        here = socket.gethostname()
        seen = json.loads(faultdrill_on("login2", "status", str(workdir), "--format", "json"))["controller"]
        assert seen["running"] is True and (seen["pid"], seen["host"]) == (controller.pid, here)
        refused = faultdrill_on("login2", "stop", str(workdir), expect=2)
        assert f"pid {controller.pid} on {here}" in refused and f"run this command on {here}" in refused
        busy = faultdrill_on("login2", "drill", str(spec), expect=2)
        assert f"pid {controller.pid} on {here}" in busy and "already drives" in busy
        assert alive(controller.pid)

        said = faultdrill("stop", str(workdir))
        assert f"pid {controller.pid}" in said and "keep running" in said
        assert live_controller(workdir) is None and not alive(controller.pid)
        [run] = status(workdir)["runs"]
        assert drill_processes(tmp_path / "work" / "runs" / "r000"), "stop must leave the job running"
        ended = status(workdir)["controller"]
        assert ended["running"] is False and ended["last_exit"]["code"] == 4

        adopted = drill(spec, timeout=600)  # adopts the job the stopped controller left
        r000 = run_of(adopted, "r000")
        assert r000["status"] == "completed" and r000["final_step"] == SLOW["steps"]
        assert [attempt["job_id"] for attempt in r000["attempts"]] == [run["job"]], "adopted, never resubmitted"
    finally:
        kill_verified(drill_processes(workdir / "runs" / "r000"))


def test_cancel_stops_the_controller_ends_the_jobs_and_records_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, workload=SLOW, baseline=True, parallel_runs=2)
    workdir = tmp_path / "work"
    faultdrill("drill", str(spec), "--detach")
    try:
        wait_for(lambda: training(workdir), "the detached drill trains")
        jobs = {run["run"]: run["job"] for run in status(workdir)["runs"]}
        said = faultdrill("cancel", str(workdir))
        assert all(f"cancelled job(s) {job}" in said for job in jobs.values()), said
        assert live_controller(workdir) is None
        wait_for(lambda: not any(drill_processes(workdir / "runs" / run) for run in jobs), "the jobs end", 30)
        for run in report(workdir)["runs"]:
            assert run["status"] == "cancelled"
            assert run["attempts"][-1]["failure_class"] == "CANCELLED"
        assert "nothing to cancel" in faultdrill("cancel", str(workdir))
        assert "no controller drives" in faultdrill("stop", str(workdir), expect=1)
    finally:
        for run in ("r000", "r000-baseline"):
            kill_verified(drill_processes(workdir / "runs" / run))


def test_a_foreground_drill_whose_session_hangs_up_stops_cleanly(tmp_path: Path) -> None:
    """Issue 21, item 2: SIGHUP (a dropped ssh session) is a stop, as SIGTERM is: the controller
    ends at its next round with the jobs left running for the next drill, not in the middle of a
    side effect."""
    spec = write_spec(tmp_path, workload={**SLOW, "steps": 10**6})  # still training when the test ends it
    workdir = tmp_path / "work"
    log = tmp_path / "drill.log"  # a file, not a pipe: the job's processes hold what they inherit
    with open(log, "wb") as stderr:
        controller = subprocess.Popen([*FAULTDRILL, "drill", str(spec), "--format", "json"],
                                      stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(lambda: (workdir / "ledger.sqlite").exists() and training(workdir), "the drill trains")
        controller.send_signal(signal.SIGHUP)
        controller.wait(timeout=60)
        said = log.read_text()
        assert controller.returncode == 4, said[-2000:]
        assert "keep running" in said and drill_processes(workdir / "runs" / "r000"), "the job is left running"
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=30)
        kill_verified(drill_processes(workdir / "runs" / "r000"))
