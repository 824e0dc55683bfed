"""The local backend (embedded default): ranks are local processes started by submitit's local executor."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import submitit
from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.layout import RankJob
from experiments.workloads import LAUNCHER_MPI
from injectors.kill_rank import FaultOutcome, kill_rank
from orchestrator.backends.base import Backend, KillRequest, Submission
from orchestrator.render import rank_environment
from orchestrator.runs import RunConfig
from orchestrator.spec import time_limit_minutes
from orchestrator.states import JobState

LOCAL_CONTROLLER_MODULE = "submitit.local._local"


class EnvLocalExecutor(submitit.LocalExecutor):
    """submitit's local executor, plus the environment Faultdrill gives every rank.

    Ranks must carry the drill's variables from exec on (the injector reads /proc/PID/environ),
    which submitit's ``setup`` can only do through a shell; this starts the controller directly.
    """

    def __init__(self, folder: Path, extra_env: dict[str, str], launcher_prefix: list[str] | None = None) -> None:
        super().__init__(folder)
        self.extra_env = extra_env
        self.launcher_prefix = launcher_prefix or []

    @property
    def _submitit_command_str(self) -> str:
        """With an MPI launcher, the launcher is the one task and starts every rank itself."""
        base = super()._submitit_command_str
        return shlex.join(self.launcher_prefix) + " " + base if self.launcher_prefix else base

    def _submit_command(self, command: str) -> submitit.local.local.LocalJob[Any]:
        ntasks = int(self.parameters.get("tasks_per_node", 1))
        timeout_min = float(self.parameters.get("timeout_min", 60.0))
        env = {
            **os.environ,
            **self.extra_env,
            "SUBMITIT_LOCAL_NTASKS": str(ntasks),
            "SUBMITIT_LOCAL_COMMAND": command,
            "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * timeout_min)),
            "SUBMITIT_LOCAL_SIGNAL_DELAY_S": "30",
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_STDERR_TO_STDOUT": "",
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_WITH_SHELL": "",
            "CUDA_VISIBLE_DEVICES": "",
        }
        process = subprocess.Popen([sys.executable, "-m", LOCAL_CONTROLLER_MODULE, str(self.folder)], env=env)
        return submitit.local.local.LocalJob(
            folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks))
        )


@dataclass
class LocalJobRecord:
    folder: Path
    ntasks: int
    process: subprocess.Popen[bytes] | None = None  # None: started by an earlier controller process


class LocalBackend(Backend):
    name = "local"

    def __init__(self, drill_id: str) -> None:
        self.drill_id = drill_id
        self._jobs: dict[str, LocalJobRecord] = {}

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        prefix = mpi_launcher(run.ranks) if run.workload_entry.launcher == LAUNCHER_MPI else []
        tasks = 1 if prefix else run.ranks
        executor = EnvLocalExecutor(run.paths.submitit, rank_environment(run, job.attempt, self.drill_id), prefix)
        executor.update_parameters(tasks_per_node=tasks, timeout_min=_minutes(run))
        submitted = executor.submit(run_rank, job)
        process = submitted._process
        assert process is not None
        self._jobs[submitted.job_id] = LocalJobRecord(run.paths.submitit, tasks, process)
        return Submission(job_id=submitted.job_id, accepted_at=time.time())

    def adopt(self, job_id: str, run: RunConfig) -> None:
        tasks = 1 if run.workload_entry.launcher == LAUNCHER_MPI else run.ranks
        self._jobs.setdefault(job_id, LocalJobRecord(run.paths.submitit, tasks))

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        return {job_id: self._state(job_id) for job_id in job_ids}

    def _state(self, job_id: str) -> JobState:
        record = self._jobs.get(job_id)
        if record is None:
            return JobState.UNKNOWN
        if record.process is None:
            return _adopted_state(job_id, record)
        code = record.process.poll()
        if code is None:
            return JobState.RUNNING
        if code < 0:
            return JobState.CANCELLED
        return JobState.COMPLETED if _all_tasks_succeeded(record, job_id) else JobState.FAILED

    def cancel(self, job_id: str) -> None:
        """End the job like scancel after its grace time: SIGKILL the tasks of the controller we
        started (a stopped or hung task ignores gentler signals); submitit's controller then exits."""
        record = self._jobs.get(job_id)
        if record is None or self._state(job_id) is not JobState.RUNNING:
            return
        try:
            tasks = psutil.Process(int(job_id)).children()
        except psutil.NoSuchProcess:
            return
        for task in tasks:
            try:
                task.kill()
            except psutil.NoSuchProcess:
                continue

    def kill_rank(self, request: KillRequest) -> FaultOutcome:
        return kill_rank(
            request.run.paths.root, request.run.run_id, request.attempt, request.rank, request.job_id, request.signal
        )


def mpi_launcher(ranks: int) -> list[str]:
    """OpenMPI's launcher for ``ranks`` local ranks: more ranks than cores is fine for a drill, and
    binding would pin every rank of a small machine to the same core. submitit's rank wrapper
    ignores SIGTERM, so survivors of a dead rank only go at mpiexec's SIGKILL: send it at once
    (measured: all ranks gone 0.13 s after a SIGKILL instead of 1.1 s)."""
    return ["mpiexec", "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
            "--mca", "odls_base_sigkill_timeout", "0"]


def _all_tasks_succeeded(record: LocalJobRecord, job_id: str) -> bool:
    for task in range(record.ntasks):
        result = submitit_utils.JobPaths(record.folder, job_id=job_id, task_id=task).result_pickle
        if not result.exists():
            return False
        outcome, _ = submitit_utils.pickle_load(result)
        if outcome != "success":
            return False
    return True


def _adopted_state(job_id: str, record: LocalJobRecord) -> JobState:
    """A job an earlier controller process started: running while its pid is still submitit's
    controller for this run's folder; once gone, complete only if every task left a success result."""
    try:
        cmdline = psutil.Process(int(job_id)).cmdline()
    except (psutil.NoSuchProcess, ValueError):
        cmdline = []
    if LOCAL_CONTROLLER_MODULE in cmdline and str(record.folder) in cmdline:
        return JobState.RUNNING
    return JobState.COMPLETED if _all_tasks_succeeded(record, job_id) else JobState.UNKNOWN


def _minutes(run: RunConfig) -> float:
    return time_limit_minutes(run.campaign.resources.time)
