"""The local backend's job: submitit's local controller, which also records how each task ended
(``<folder>/<pid>_exit_codes.json``), as a scheduler's step exit would say: a rank killed by a
signal leaves no result of its own, and only its parent sees the signal. Like ``srun
--kill-on-bad-exit=1``, the first task that fails ends the others (the step exit is that task's).

With restart.strategy in-allocation (``FAULTDRILL_RELAUNCH_WAIT_S`` set) it is also what the Slurm
batch script is there: after its tasks (the ranks) failed it appends the step_exit event, waits
for the controller's go — the fence naming a later attempt and this job — and starts the ranks
again as that attempt, in the same job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from submitit.local.local import Controller, LocalJobEnvironment

from experiments.layout import (
    ENV_ATTEMPT,
    ENV_RELAUNCH_WAIT_S,
    ENV_RUN_DIR,
    EVENT_STEP_EXIT,
    SIGNAL_EXIT_BASE,
    RunPaths,
    append_json_line,
)
from experiments.runtime.fence import StaleAttemptError, read_fence, same_job
from orchestrator.backends.local.warm import COMPLETED as WARM_COMPLETED
from orchestrator.backends.local.warm import WARM_VERDICT, LocalWarmJob, record_verdict, warm_requested

GO_POLL_S = 0.1
KILL_WAIT_S = 2.0  # Slurm's KillWait (30 s by default) for a local job: SIGTERM to SIGKILL


def exit_codes_file(folder: Path, job_id: str) -> Path:
    return folder / f"{job_id}_exit_codes.json"


def read_step_exit(folder: Path, job_id: str) -> int | None:
    """The job's step exit code from what its controller recorded; None before it recorded one.
    A warm job's is its coordinator's verdict: 0 if the run completed (a rank that died on the way
    was replaced), else 1."""
    try:
        recorded = json.loads(exit_codes_file(folder, job_id).read_text())
        codes = recorded["exit_codes"]
    except (OSError, ValueError, KeyError):
        return None
    if WARM_VERDICT in recorded:
        return 0 if recorded[WARM_VERDICT] == WARM_COMPLETED else 1
    return step_exit_code(codes, recorded.get("first_failed_task")) if codes else None


def warm_completed(folder: Path, job_id: str) -> bool:
    """The job ran warm and its coordinator says the run completed."""
    try:
        return json.loads(exit_codes_file(folder, job_id).read_text()).get(WARM_VERDICT) == WARM_COMPLETED
    except (OSError, ValueError):
        return False


def step_exit_code(codes: Sequence[int | None], first_failed: int | None = None) -> int:
    """The tasks' exits as one step exit code, a signal N as 128 + N: the first failed task's (the
    others' exits are the step's end, not its cause); without that record, a signal, else the first failure."""
    first = codes[first_failed] if first_failed is not None else None
    if first:
        return _as_exit_code(first)
    signals = [code for code in codes if code is not None and code < 0]
    if signals:
        return _as_exit_code(signals[0])
    failed = [code for code in codes if code]
    return failed[0] if failed else 0


def _as_exit_code(code: int) -> int:
    return SIGNAL_EXIT_BASE - code if code < 0 else code


class RecordingController(Controller):
    step_exit: int = 0  # the last wait's step exit code

    def wait(self, freq: int = 24) -> Sequence[int | None]:
        codes, first_failed = self._wait_ending_on_bad_exit(1.0 / freq)
        self.step_exit = step_exit_code(codes, first_failed)
        path = exit_codes_file(self.folder, str(self.pid))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"exit_codes": list(codes), "first_failed_task": first_failed}))
        os.replace(tmp, path)
        return codes

    def _wait_ending_on_bad_exit(self, pause_s: float) -> tuple[list[int | None], int | None]:
        """submitit's wait (every task ends, or the time limit: its warning signal first), but the
        first task that fails ends the step, as ``srun --kill-on-bad-exit=1``: the others get SIGTERM,
        then SIGKILL after KILL_WAIT_S. A survivor waiting on its dead peer (a file barrier has no
        socket to break) would wait until the hang timeout. Returns the codes and the first failed task."""
        started = time.monotonic()
        first_failed: int | None = None
        terminated_at: float | None = None
        warned = False
        while True:
            codes = [task.poll() for task in self.tasks]
            elapsed = time.monotonic() - started
            if all(code is not None for code in codes) or elapsed >= self.timeout_s:
                return codes, first_failed
            if first_failed is None:
                first_failed = next((task for task, code in enumerate(codes) if code), None)
                if first_failed is not None:
                    self._forward_signal(signal.SIGTERM)
                    terminated_at = time.monotonic()
            elif terminated_at is not None and time.monotonic() - terminated_at >= KILL_WAIT_S:
                self._forward_signal(signal.SIGKILL)
                terminated_at = None
            if not warned and elapsed >= self.timeout_s - self.signal_delay_s:
                self._forward_signal(LocalJobEnvironment._usr_sig())
                warned = True
            time.sleep(pause_s)

    def run(self, max_retry: int = 6) -> None:
        if warm_requested():
            self.run_warm()
            return
        wait_s = os.environ.get(ENV_RELAUNCH_WAIT_S)
        if wait_s is None:
            super().run(max_retry)
            return
        self.run_in_allocation(float(wait_s))

    def run_warm(self) -> None:
        """restart.strategy warm (orchestrator/backends/local/warm.py): the coordinator's verdict is the job's."""
        job = LocalWarmJob(self)
        verdict = job.run()
        record_verdict(exit_codes_file(self.folder, str(self.pid)), job.codes(), verdict)
        sys.exit(0 if verdict == WARM_COMPLETED else 1)

    def run_in_allocation(self, wait_s: float) -> None:
        paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        attempt = int(os.environ[ENV_ATTEMPT])
        while True:
            try:
                self.start_tasks()
                self.wait()
                code = self.step_exit
            finally:
                self.kill_tasks()
            append_json_line(paths.script_events_file(attempt), {"event": EVENT_STEP_EXIT, "time": time.time(),
                                                          "exit_code": code})
            if code == 0:
                return
            following = self._go(paths, attempt, wait_s)
            if following is None:
                sys.exit(code)
            attempt = following
            os.environ[ENV_ATTEMPT] = str(attempt)

    def _go(self, paths: RunPaths, attempt: int, wait_s: float) -> int | None:
        """The attempt the controller names for this job next, or None by the deadline (or when
        another job is the current one)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                fence = read_fence(paths)
            except StaleAttemptError:
                return None
            if fence is not None and fence.job_id is not None:
                if not same_job(fence.job_id, self.pid):
                    return None
                if fence.attempt > attempt:
                    return fence.attempt
            time.sleep(GO_POLL_S)
        return None


if __name__ == "__main__":
    assert len(sys.argv) == 2, "usage: python -m orchestrator.backends.local.controller <submitit folder>"
    RecordingController(Path(sys.argv[1])).run()
