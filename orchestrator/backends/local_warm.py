"""The local backend's job under ``restart.strategy: warm``: the warm coordinator runs here, in the
job's own process (as the batch script's would on a cluster), beside the ranks and warm spares it
started as tasks. A dead task is the coordinator's business, not the end of the step (no
kill-on-bad-exit): it gives the dead rank's place to a spare and this process starts a new spare.
The job succeeds when the coordinator says the run completed."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from submitit.core import utils as submitit_utils

from experiments.layout import ENV_ATTEMPT, ENV_RUN_DIR, RunPaths, append_json_line
from experiments.runtime.distenv import derive_port
from experiments.runtime.fence import Fence, write_fence
from experiments.runtime.warm.coordinator import Coordinator, CoordinatorGaveUp
from experiments.runtime.warm.members import end_members
from experiments.runtime.warm.protocol import ENV_ADDRESS, ENV_COORDINATOR, ENV_SLOT, ENV_SPARES, ENV_WORLD
from orchestrator.failure_classes import SIGNAL_EXIT_BASE

log = logging.getLogger(__name__)

WARM_VERDICT = "warm"  # the exit codes file's key for the coordinator's verdict
COMPLETED = "completed"
LOOPBACK = "127.0.0.1"


def warm_requested() -> bool:
    return ENV_WORLD in os.environ


class LocalWarmJob:
    """Tasks by slot (the first ones as submitit's controller starts them, spares started later),
    and the coordinator between them."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller  # orchestrator.backends.local_controller.RecordingController
        self.paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        self.first_attempt = int(os.environ[ENV_ATTEMPT])
        self.world, self.spares = int(os.environ[ENV_WORLD]), int(os.environ[ENV_SPARES])
        self.slots: dict[int, subprocess.Popen[str]] = {}
        self._files: list[IO[str]] = []

    def run(self) -> str:
        """The coordinator's verdict: "completed", or why the job could not go on warm."""
        listener = socket.create_server((LOOPBACK, 0))
        os.environ[ENV_COORDINATOR] = f"{LOOPBACK}:{listener.getsockname()[1]}"
        os.environ[ENV_ADDRESS] = LOOPBACK
        coordinator = Coordinator(
            world_size=self.world, spares_wanted=self.spares, first_attempt=self.first_attempt,
            port_base=derive_port(f"warm-{self.controller.pid}"), events=self._event, fence=self._fence,
            spawn=self._spawn, exit_code=self._exit_code)
        verdict: dict[str, str] = {}
        serving = threading.Thread(target=self._serve, args=(coordinator, listener, verdict), name="warm", daemon=True)
        self.controller.start_tasks()
        self.slots.update(enumerate(self.controller.tasks))
        serving.start()
        while serving.is_alive():
            if all(task.poll() is not None for task in list(self.slots.values())):
                coordinator.abort("every process of the job has exited")
            serving.join(timeout=0.1)
        self._end_tasks()
        return verdict.get("verdict", "the coordinator ended without a verdict")

    def _serve(self, coordinator: Coordinator, listener: socket.socket, verdict: dict[str, str]) -> None:
        try:
            verdict["verdict"] = coordinator.serve(listener)
        except CoordinatorGaveUp as error:
            verdict["verdict"] = str(error)
            log.warning("%s", error)

    def _event(self, attempt: int, event: dict[str, Any]) -> None:
        append_json_line(self.paths.events_file(attempt), event)

    def _fence(self, attempt: int) -> None:
        write_fence(self.paths, Fence(attempt, self.controller.pid))

    def _spawn(self, slot: int, attempt: int, node: str | None) -> None:
        """One more task of this job, as submitit's controller starts its tasks, as a warm spare of
        ``attempt`` (the run's current one: the fence lets it start)."""
        job_paths = submitit_utils.JobPaths(self.controller.folder, self.controller.pid, slot)
        stdout, stderr = job_paths.stdout.open("a"), job_paths.stderr.open("a")
        self._files += [stdout, stderr]
        env = {**os.environ, "SUBMITIT_LOCAL_LOCALID": str(slot), "SUBMITIT_LOCAL_GLOBALID": str(slot),
               "SUBMITIT_LOCAL_NTASKS": str(slot + 1), "SUBMITIT_LOCAL_JOB_ID": self.controller.pid, ENV_SLOT: str(slot),
               ENV_ATTEMPT: str(attempt)}
        self.slots[slot] = subprocess.Popen(self.controller.command, env=env, stdout=stdout, stderr=stderr,
                                            encoding="utf-8")

    def _exit_code(self, slot: int) -> int | None:
        """How the slot's process ended (its connection ended a moment before: wait for it briefly)."""
        task = self.slots.get(slot)
        if task is None:
            return None
        try:
            code = task.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None
        return SIGNAL_EXIT_BASE - code if code < 0 else code  # a signal N as 128 + N, as a step exit says it

    def _end_tasks(self) -> None:
        end_members(self.slots.values(), stop=subprocess.Popen.kill)
        for handle in self._files:
            handle.close()

    def codes(self) -> list[int | None]:
        return [self.slots[slot].poll() for slot in sorted(self.slots)]


def record_verdict(path: Path, codes: list[int | None], verdict: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"exit_codes": codes, "first_failed_task": None, WARM_VERDICT: verdict}))
    os.replace(tmp, path)
