"""The local backend's job: submitit's local controller, which also records how each task ended
(``<folder>/<pid>_exit_codes.json``), as a scheduler's step exit would say: a rank killed by a
signal leaves no result of its own, and only its parent sees the signal.

With restart.strategy in-allocation (``FAULTDRILL_RELAUNCH_WAIT_S`` set) it is also what the Slurm
batch script is there: after its tasks (the ranks) failed it appends the step_exit event, waits
for the controller's go — the fence naming a later attempt and this job — and starts the ranks
again as that attempt, in the same job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from submitit.local.local import Controller

from experiments.layout import ENV_ATTEMPT, ENV_RUN_DIR, EVENT_STEP_EXIT, RunPaths, append_json_line
from experiments.runtime.fence import StaleAttemptError, read_fence, same_job
from orchestrator.failure_classes import SIGNAL_EXIT_BASE

ENV_RELAUNCH_WAIT_S = "FAULTDRILL_RELAUNCH_WAIT_S"
GO_POLL_S = 0.1


def exit_codes_file(folder: Path, job_id: str) -> Path:
    return folder / f"{job_id}_exit_codes.json"


def step_exit_code(codes: Sequence[int | None]) -> int:
    """The tasks' exits as one step exit code: a signal N as 128 + N, else the first failure."""
    signals = [code for code in codes if code is not None and code < 0]
    if signals:
        return SIGNAL_EXIT_BASE - signals[0]
    failed = [code for code in codes if code]
    return failed[0] if failed else 0


class RecordingController(Controller):
    def wait(self, freq: int = 24) -> Sequence[int | None]:
        codes = super().wait(freq)
        path = exit_codes_file(self.folder, str(self.pid))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"exit_codes": list(codes)}))
        os.replace(tmp, path)
        return codes

    def run(self, max_retry: int = 6) -> None:
        wait_s = os.environ.get(ENV_RELAUNCH_WAIT_S)
        if wait_s is None:
            super().run(max_retry)
            return
        self.run_in_allocation(float(wait_s))

    def run_in_allocation(self, wait_s: float) -> None:
        paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        attempt = int(os.environ[ENV_ATTEMPT])
        while True:
            try:
                self.start_tasks()
                code = step_exit_code(self.wait())
            finally:
                self.kill_tasks()
            append_json_line(paths.events_file(attempt), {"event": EVENT_STEP_EXIT, "time": time.time(),
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
    assert len(sys.argv) == 2, "usage: python -m orchestrator.backends.local_controller <submitit folder>"
    RecordingController(Path(sys.argv[1])).run()
