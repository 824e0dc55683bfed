"""The local backend's job under ``restart.strategy: warm``: the warm coordinator runs here, in the
job's own process (as the batch script's would on a cluster), beside the ranks and warm spares it
started as tasks. A dead task is the coordinator's business, not the end of the step (no
kill-on-bad-exit): it gives the dead rank's place to a spare and this process starts a new spare.
The job succeeds when the coordinator says the run completed.

TensorFlow and Chainer (restart-all): the ranks and the spares are sets, each started here as the
controller would start its tasks (Chainer's one task is its set's ``mpiexec``), each set with its own
ports; the coordinator's ``end`` retires a set's processes after a failure."""

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

from experiments.layout import (
    ENV_ATTEMPT,
    ENV_DRILL_ID,
    ENV_MASTER_PORT,
    ENV_RUN_DIR,
    ENV_WARM_ADDRESS,
    ENV_WARM_COORDINATOR,
    ENV_WARM_RESTART_ALL,
    ENV_WARM_SECRET,
    ENV_WARM_SET,
    ENV_WARM_SLOT,
    ENV_WARM_SPARES,
    ENV_WARM_WORLD,
    SIGNAL_EXIT_BASE,
    RunPaths,
    append_json_line,
)
from experiments.runtime.distenv import derive_port
from experiments.runtime.fence import Fence
from experiments.warm.coordinator import ANYWHERE, Coordinator, CoordinatorGaveUp, Placement
from experiments.warm.held_fence import HeldFence
from experiments.warm.processes import end_members, processes_of, retire
from experiments.warm.protocol import new_secret, set_port
from experiments.warm.store_host import StoreHost

log = logging.getLogger(__name__)

WARM_VERDICT = "warm"  # the exit codes file's key for the coordinator's verdict
COMPLETED = "completed"
LOOPBACK = "127.0.0.1"


def warm_requested() -> bool:
    return ENV_WARM_WORLD in os.environ


class LocalWarmJob:
    """Tasks by slot (the first ones as submitit's controller starts them, spares started later),
    and the coordinator between them."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller  # orchestrator.backends.local.controller.RecordingController
        self.paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        self.first_attempt = int(os.environ[ENV_ATTEMPT])
        self.world, self.spares = int(os.environ[ENV_WARM_WORLD]), int(os.environ[ENV_WARM_SPARES])
        self.restart_all = os.environ.get(ENV_WARM_RESTART_ALL) == "1"
        self.port_base = derive_port(f"warm-{self.controller.pid}")
        self.slots: dict[int, subprocess.Popen[str]] = {}
        self._files: list[IO[str]] = []

    def run(self) -> str:
        """The coordinator's verdict: "completed", or why the job could not go on warm."""
        listener = socket.create_server((LOOPBACK, 0))
        os.environ[ENV_WARM_COORDINATOR] = f"{LOOPBACK}:{listener.getsockname()[1]}"
        os.environ[ENV_WARM_ADDRESS] = LOOPBACK
        os.environ[ENV_WARM_SECRET] = secret = new_secret()  # the members' environment only: the user's and root's
        coordinator = Coordinator(
            world_size=self.world, spares_wanted=self.spares, first_attempt=self.first_attempt,
            port_base=self.port_base, events=self._event,
            fence=HeldFence(self.paths, Fence(self.first_attempt, str(self.controller.pid), os.environ.get(ENV_DRILL_ID))).advance,
            secret=secret,
            spawn=self._spawn_set if self.restart_all else self._spawn, exit_code=self._exit_code,
            restart_all=self.restart_all, end=self._end_slots,
            stores=None if self.restart_all else StoreHost(LOOPBACK))
        verdict: dict[str, str] = {}
        serving = threading.Thread(target=self._serve, args=(coordinator, listener, verdict), name="warm", daemon=True)
        if self.restart_all:
            for number in range(1 + self.spares):  # the ranks' set, then the spare sets
                self._spawn_set(number * self.world, self.first_attempt)
        else:
            self.controller.start_tasks()
            self.slots.update(enumerate(self.controller.tasks))
        serving.start()
        ended: set[int] = set()
        while serving.is_alive():
            if all(task.poll() is not None for task in list(self.slots.values())):
                coordinator.abort("every process of the job has exited")
            ended |= self._report_ended(coordinator, ended)
            serving.join(timeout=0.1)
        self._end_tasks()
        return verdict.get("verdict", "the coordinator ended without a verdict")

    def _report_ended(self, coordinator: Coordinator, reported: set[int]) -> set[int]:
        """Slots whose process ended since the last look, told to the coordinator (as the batch host
        tells it of a launch that ended): one that never said hello is none on its way."""
        ended = {slot for slot, task in list(self.slots.items()) if task.poll() is not None} - reported
        if ended:
            coordinator.launch_ended(sorted(ended))
        return ended

    def _serve(self, coordinator: Coordinator, listener: socket.socket, verdict: dict[str, str]) -> None:
        try:
            verdict["verdict"] = coordinator.serve(listener)
        except CoordinatorGaveUp as error:
            verdict["verdict"] = str(error)
            log.warning("%s", error)

    def _event(self, attempt: int, event: dict[str, Any]) -> None:
        append_json_line(self.paths.coordinator_events_file(attempt), event)

    def _spawn(self, slot: int, attempt: int, _where: Placement = ANYWHERE) -> None:
        """One more task of this job, as submitit's controller starts its tasks, as a warm spare of
        ``attempt`` (the run's current one: the fence lets it start)."""
        self.slots[slot] = self._start(slot, {"SUBMITIT_LOCAL_LOCALID": str(slot), "SUBMITIT_LOCAL_GLOBALID": str(slot),
                                              "SUBMITIT_LOCAL_NTASKS": str(slot + 1), ENV_WARM_SLOT: str(slot),
                                              ENV_ATTEMPT: str(attempt)})

    def _spawn_set(self, first_slot: int, attempt: int, _where: Placement = ANYWHERE) -> None:
        """restart-all: the set of ranks whose first slot is ``first_slot``, as the controller starts
        its tasks (TensorFlow: one per rank; Chainer: one ``mpiexec`` that starts them all), with the
        set's own ports (its collective forms now, beside the others')."""
        number, tasks = first_slot // self.world, self.controller.ntasks
        per_task = self.world // tasks
        for task in range(tasks):
            process = self._start(first_slot + task * per_task, {
                "SUBMITIT_LOCAL_LOCALID": str(task), "SUBMITIT_LOCAL_GLOBALID": str(task),
                "SUBMITIT_LOCAL_NTASKS": str(tasks), ENV_WARM_SET: str(number), ENV_ATTEMPT: str(attempt),
                ENV_MASTER_PORT: str(set_port(self.port_base, number, self.world))})
            for slot in range(first_slot + task * per_task, first_slot + (task + 1) * per_task):
                self.slots[slot] = process

    def _start(self, first_slot: int, variables: dict[str, str]) -> "subprocess.Popen[str]":
        job_paths = submitit_utils.JobPaths(self.controller.folder, self.controller.pid, first_slot)
        stdout, stderr = job_paths.stdout.open("a"), job_paths.stderr.open("a")
        self._files += [stdout, stderr]
        env = {**os.environ, "SUBMITIT_LOCAL_JOB_ID": self.controller.pid, **variables}
        return subprocess.Popen(self.controller.command, env=env, stdout=stdout, stderr=stderr, encoding="utf-8")

    def _end_slots(self, slots: list[int]) -> None:
        """A retired set's processes, waited for: an ``mpiexec`` is terminated (it ends its ranks;
        SIGKILL would leave them behind), a rank itself killed."""
        retire(self._processes(slots), stop=self._stop)

    def _stop(self, process: "subprocess.Popen[str]") -> None:
        if self.restart_all and self.controller.ntasks == 1 and self.world > 1:
            process.terminate()
        else:
            process.kill()

    def _processes(self, slots: list[int]) -> list["subprocess.Popen[str]"]:
        return processes_of(self.slots, slots)

    def _exit_code(self, slot: int) -> int | None:
        """How the slot's process ended (its connection ended a moment before: wait for it briefly).
        None for a launch of several slots (Chainer's ``mpiexec``): it outlives the rank (the
        survivors serve their state), and its end would not be the rank's."""
        task = self.slots.get(slot)
        if task is None or sum(process is task for process in self.slots.values()) > 1:
            return None
        try:
            code = task.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None
        return SIGNAL_EXIT_BASE - code if code < 0 else code  # a signal N as 128 + N, as a step exit says it

    def _end_tasks(self) -> None:
        end_members(self._processes(sorted(self.slots)), stop=self._stop)
        for handle in self._files:
            handle.close()

    def codes(self) -> list[int | None]:
        return [process.poll() for process in self._processes(sorted(self.slots))]


def record_verdict(path: Path, codes: list[int | None], verdict: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"exit_codes": codes, "first_failed_task": None, WARM_VERDICT: verdict}))
    os.replace(tmp, path)
