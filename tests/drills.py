"""Helpers for tests that run whole drills on the local backend (real processes, no scheduler)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psutil
import yaml

from faultdrill_cli import FAULTDRILL

# The end-to-end drill's fault: rank 1 SIGKILLed 0.2 s after the first checkpoint.
KILL_RANK_1 = [{"kind": "kill-rank", "after": {"fixed": 0.2}, "anchor": "first_checkpoint", "rank": 1}]
# Its workload, paced: 160 unpaced steps of this model take well under a second on an idle machine,
# and that kill (the agent's start on top) once came after the last step in CI.
PACED = {"framework": "torch", "params": 20000, "steps": 160, "seed": 3, "batch_size": 16, "step_s": 0.02}


# A rank with no framework: tests/api_trainer.py, through the rank API (heartbeats, checkpoints in the
# store, its resume, a digest for the twin). ~0.2 s of CPU to start where a torch rank takes ~5 s
# (its import and dynamo's): for tests of the drill's own bookkeeping, where what trains is not the point.
API_TRAINER = Path(__file__).resolve().parent / "api_trainer.py"


def api_workload(steps: int = 160, step_s: float = 0.01) -> dict[str, Any]:
    """API_TRAINER for ``steps`` steps of ``step_s`` each."""
    return {"command": ["python", str(API_TRAINER), "--step-s", str(step_s)], "framework": "other", "steps": steps}


def write_spec(tmp_path: Path, **overrides: Any) -> Path:
    """A small drill on 2 local ranks (the framework-free API_TRAINER, 160 steps); ``overrides``
    replace top-level sections."""
    spec: dict[str, Any] = {
        "name": "local-hardening",
        "backend": "local",
        "workdir": str(tmp_path / "work"),
        "workload": api_workload(),
        "checkpoint": {"every_steps": 20, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
        "faults": [],
        "restart": {"max_restarts": 2, "poll_interval_s": 0.05},
    }
    spec.update(overrides)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def drill(spec: Path, timeout: float = 300, expect: int | None = 0, html: bool = False) -> dict[str, Any]:
    """``faultdrill drill SPEC --format json`` (exit code ``expect``; None: 0, or 1 when a run did not
    complete, for tests that each look at their own run), its report. The report page (matplotlib,
    ~2 s a drill) only if asked: tests/drill/test_html_report.py checks it."""
    try:
        done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json", *([] if html else ["--no-html"])],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # the controller is killed; what it started is the test's to end
        kill_verified(drill_leftovers(workdir_of(spec)))
        raise
    assert done.returncode in ((0, 1) if expect is None else (expect,)), done.stderr[-4000:]
    return json.loads(done.stdout)


def run_of(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    return next(run for run in report["runs"] if run["run_id"] == run_id)


def ledger_sql(workdir: Path, statement: str, *args: Any) -> None:
    """Change the ledger as a controller stopped at the wrong moment would have left it."""
    with sqlite3.connect(workdir / "ledger.sqlite") as db:
        db.execute(statement, args)


def drill_processes(run_dir: Path, attempt: int | None = None) -> list[psutil.Process]:
    """This machine's processes started for the run in ``run_dir`` (and ``attempt``): their
    environment says so (FAULTDRILL_RUN_DIR is unique to a test's run)."""
    found = []
    for process in psutil.process_iter():
        try:
            environ = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if environ.get("FAULTDRILL_RUN_DIR") == str(run_dir) and (
                attempt is None or environ.get("FAULTDRILL_ATTEMPT") == str(attempt)):
            if os.getpid() != process.pid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def workdir_of(spec: Path) -> Path:
    workdir = Path(yaml.safe_load(spec.read_text())["workdir"])
    return workdir if workdir.is_absolute() else spec.parent / workdir


def drill_leftovers(workdir: Path) -> list[psutil.Process]:
    """This machine's processes of the drill in ``workdir`` (a test's own folder): its ranks by the
    run directory in their environment, the local backend's job controllers by the run folder in
    their arguments."""
    runs = str(workdir.resolve() / "runs") + os.sep
    found = []
    for process in psutil.process_iter():
        try:
            ours = (process.environ().get("FAULTDRILL_RUN_DIR", "").startswith(runs)
                    or any(arg.startswith(runs) for arg in process.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if ours and process.pid != os.getpid():
            found.append(process)
    return found


def kill_verified(processes: list[psutil.Process]) -> None:
    """Clean up processes a test found by their verified drill environment (never by name)."""
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue


def memory_cgroup_writable() -> bool:
    """Whether this process may cap another's memory (oom-rank): root and a writable cgroup v1 memory
    controller."""
    from injectors.memory_cgroup import can_cap_memory

    return can_cap_memory(os.getpid()) is None


