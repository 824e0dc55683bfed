"""The local backend's job ends its step when one task fails, as ``srun --kill-on-bad-exit=1`` does
on Slurm: a survivor waiting on its dead peer (a file barrier during a checkpoint has no socket to
break) would otherwise sit there until the hang timeout, and the failure read as a HANG (seen in CI:
the rank API example's SIGKILL classed HANG after 120 s). The step's exit code is the first failed
task's, not the signal the survivors were ended with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.backends.local.backend import LOCAL_CONTROLLER_MODULE, kill_tree
from orchestrator.backends.local.controller import exit_codes_file, read_step_exit

# Task 1 dies (SIGKILL, or exit 3) at once; task 0 waits "forever" (as a rank in a file barrier
# does), optionally ignoring SIGTERM (then only the SIGKILL after the grace time ends it).
TASKS = r"""
import os, signal, sys, time
death, survivor = sys.argv[1], sys.argv[2]
if os.environ["SUBMITIT_LOCAL_LOCALID"] == "1":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL) if death == "sigkill" else sys.exit(3)
if survivor == "ignores-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(300)
"""


def _controller(tmp_path: Path, death: str, survivor: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "tasks.py"
    script.write_text(TASKS)
    env = {**os.environ, "SUBMITIT_LOCAL_NTASKS": "2",
           "SUBMITIT_LOCAL_COMMAND": " ".join([sys.executable, str(script), death, survivor]),
           "SUBMITIT_LOCAL_TIMEOUT_S": "600", "SUBMITIT_LOCAL_SIGNAL_DELAY_S": "30",
           "SUBMITIT_STDERR_TO_STDOUT": "", "SUBMITIT_LOCAL_WITH_SHELL": ""}
    return subprocess.Popen([sys.executable, "-m", LOCAL_CONTROLLER_MODULE, str(tmp_path / "job")], env=env)


def _ended_within(process: subprocess.Popen[bytes], seconds: float) -> float:
    started = time.monotonic()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        kill_tree(psutil.Process(process.pid), include_root=True)  # its tasks too: the test started them
        process.wait()
        raise AssertionError(f"the job still ran {seconds:g} s after one of its tasks was SIGKILLed") from None
    return time.monotonic() - started


def test_a_dead_task_ends_its_waiting_peer_and_the_step_exit_is_the_dead_tasks(tmp_path: Path) -> None:
    controller = _controller(tmp_path, "sigkill", "waits")
    took = _ended_within(controller, 30)
    assert took < 10, took
    recorded = json.loads(exit_codes_file(tmp_path / "job", str(controller.pid)).read_text())
    assert recorded["exit_codes"][1] == -9 and recorded["exit_codes"][0] == -15  # the survivor: SIGTERM
    assert read_step_exit(tmp_path / "job", str(controller.pid)) == 128 + 9


def test_a_survivor_that_ignores_sigterm_is_killed_after_the_grace_time(tmp_path: Path) -> None:
    """The first failure is the cause: an exit 3, not the SIGKILL the survivor got later."""
    controller = _controller(tmp_path, "exit3", "ignores-sigterm")
    _ended_within(controller, 30)
    recorded = json.loads(exit_codes_file(tmp_path / "job", str(controller.pid)).read_text())
    assert recorded["exit_codes"] == [-9, 3]
    assert read_step_exit(tmp_path / "job", str(controller.pid)) == 3
