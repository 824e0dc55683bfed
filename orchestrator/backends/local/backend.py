"""The local backend (embedded default): ranks are local processes started by submitit's local executor."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import psutil
import submitit
from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.launchers import Launch, Mpiexec, MpiRuntime, argv, runtime_here
from experiments.layout import (
    ENV_ATTEMPT,
    ENV_DRILL_ID,
    ENV_JOB_ID,
    ENV_RUN_ID,
    ENV_WARM_WORLD,
    EVENT_PROCESS_START,
    RankJob,
    RunPaths,
    read_attempt_events,
)
from experiments.runtime.identity import start_ticks
from experiments.workloads import LAUNCHER_MPI
from orchestrator.backends.base import AttemptRef, Backend, Submission
from orchestrator.backends.local.controller import ENV_RELAUNCH_WAIT_S, read_step_exit, warm_completed
from orchestrator.campaign.capabilities import LOCAL
from orchestrator.campaign.mpi import runtime_for
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import time_limit_minutes
from orchestrator.commands import CommandResult, run_command
from orchestrator.render.scripts import rank_environment, task_command
from orchestrator.states import JobState

LOCAL_CONTROLLER_MODULE = "orchestrator.backends.local.controller"  # submitit's, recording exit codes


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
        # the task command of every backend (experiments/task.py): with no scheduler's job id, it
        # sets the rank's thread limits, then runs submitit's runner (which imports NumPy first)
        base = shlex.join([*task_command(sys.executable), str(self.folder)])
        return shlex.join(self.launcher_prefix) + " " + base if self.launcher_prefix else base

    def _submit_command(self, command: str) -> submitit.local.local.LocalJob[Any]:
        ntasks = int(self.parameters.get("tasks_per_node", 1))
        timeout_min = float(self.parameters.get("timeout_min", 60.0))
        env = {
            # not a job id this process inherited (a drill started inside a job of Faultdrill's):
            # a local task would take it for its own and look for that job's pickled call
            **{name: value for name, value in os.environ.items() if name != ENV_JOB_ID},
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
    run_id: str = ""  # an adopted job's environment must name this run before we signal it
    cancelled: bool = False  # ended by cancel (as a scheduler says CANCELLED, not FAILED)


class LocalBackend(Backend):
    capabilities = LOCAL
    name = "local"
    poll_interval_s = 0.0  # asking the local processes costs nothing
    slow_commands = False  # its submissions start processes at once (and share its table of jobs)
    one_clock = True  # its jobs run on this host

    def __init__(self, drill_id: str) -> None:
        self.drill_id = drill_id
        self._jobs: dict[str, LocalJobRecord] = {}

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        launch = LocalLaunch.of(run, job.attempt, self.drill_id)
        executor = EnvLocalExecutor(run.paths.submitit, launch.environment, launch.prefix)
        executor.update_parameters(tasks_per_node=launch.tasks, timeout_min=_minutes(run))
        submitted = cast("submitit.LocalJob[Any]", executor.submit(run_rank, job))  # typed as the base Job
        process = submitted._process
        assert process is not None
        self._jobs[submitted.job_id] = LocalJobRecord(run.paths.submitit, launch.tasks, process, run.run_id)
        return Submission(job_id=submitted.job_id, accepted_at=time.time())

    def adopt(self, job_id: str, run: RunConfig, job: RankJob) -> None:
        super().adopt(job_id, run, job)
        tasks = run.local_tasks
        self._jobs.setdefault(job_id, LocalJobRecord(run.paths.submitit, tasks, run_id=run.run_id))

    def find_submitted(self, ref: AttemptRef) -> list[str]:
        """A job of this attempt that an earlier controller started but never recorded: the live
        submitit controller whose environment names this drill, run and attempt; else the job id
        the attempt's ranks recorded (the job may have ended since)."""
        live = [str(process.pid) for process in _local_controllers(ref.run.paths.submitit)
                if _environment_names(process, ref.run.run_id, ref.attempt, self.drill_id)]
        if live:
            return sorted(live, key=int)
        return _recorded_job_ids(ref.run.paths, ref.attempt)

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
        if _all_tasks_succeeded(record, job_id):
            return JobState.COMPLETED
        return JobState.CANCELLED if record.cancelled else JobState.FAILED

    def cancel(self, job_id: str, force: bool = False) -> None:
        """End the job like scancel after its grace time: SIGKILL every process below the job's
        submitit controller (tasks, an MPI launcher and the ranks it started; a stopped or hung
        rank ignores gentler signals); the controller then exits. ``force`` kills it too."""
        record = self._jobs.get(job_id)
        if record is None:
            return
        controller = self._verified_controller(job_id, record)
        if controller is None:
            return
        record.cancelled = True
        # A job that relaunches its ranks (in-allocation) would wait for a go, a warm job's coordinator
        # would start spares and fence a new attempt: it ends with them.
        kill_tree(controller, include_root=force or _outlives_its_tasks(controller))

    def _verified_controller(self, job_id: str, record: "LocalJobRecord") -> psutil.Process | None:
        """The job's submitit controller, if it still runs: the process we started, or for an
        adopted job a process whose command line and environment prove it is this run's."""
        try:
            process = psutil.Process(int(job_id))
        except (psutil.NoSuchProcess, ValueError):
            return None
        if record.process is not None:
            return process if record.process.poll() is None else None
        if LOCAL_CONTROLLER_MODULE in _cmdline(process) and str(record.folder) in _cmdline(process) \
                and record.run_id and _environment_names(process, record.run_id, None, self.drill_id):
            return process
        return None

    def exit_code(self, job_id: str) -> int | None:
        """How the job's tasks ended, as a step exit code: a signal N as 128 + N, else the first failure
        (a task killed by a signal is the cause; the others' exits are their reaction to it)."""
        record = self._jobs.get(job_id)
        return None if record is None else read_step_exit(record.folder, job_id)

    def kill_rank_step(self, job_id: str, attempt: int, started_before: int) -> bool:
        """SIGKILL the job's ranks of ``attempt`` (every process below its controller that belongs
        to it), not the controller: with in-allocation it starts them again on the controller's go,
        maybe before this kill is over."""
        record = self._jobs.get(job_id)
        controller = self._verified_controller(job_id, record) if record is not None else None
        if controller is None:
            return False
        # Only the ranks there when the controller decided, before it gave the next attempt's go:
        # the job relaunches on that go, and a new rank between its fork and its exec still shows
        # the controller's environment (the job's first attempt), which would pass for the hung
        # attempt's. (Taken here, in the kill's thread, the moment could come after the go.)
        kill_tree(controller, include_root=False, attempt=attempt, born_before=started_before)
        return True

    def run_agent(self, job_id: str, node: str, argv: list[str], timeout_s: float) -> CommandResult:
        """Every rank is on this machine: the agent is a local process."""
        return run_command([sys.executable, *argv], timeout_s=timeout_s, check=False)


@dataclass(frozen=True)
class LocalLaunch:
    """What the local backend starts for an attempt: ``tasks`` processes of submitit's task command,
    after ``prefix`` (mpiexec, for an MPI framework: one task that starts the ranks), with
    ``environment``. One place for ``submit`` and for ``faultdrill render``."""

    prefix: list[str]
    tasks: int
    environment: dict[str, str]

    @classmethod
    def of(cls, run: RunConfig, attempt: int, drill_id: str) -> "LocalLaunch":
        environment = rank_environment(run, attempt, drill_id)
        if run.strategy_traits.relaunches_in_job:
            environment[ENV_RELAUNCH_WAIT_S] = f"{run.campaign.restart.relaunch_wait_s:g}"
        prefix = (mpi_launcher(run.ranks, runtime_for(run.mpi), survivors_stay=run.strategy_traits.warm)
                  if run.workload_entry.launcher == LAUNCHER_MPI else [])
        return cls(prefix, run.local_tasks, environment)


def describe_local(run: RunConfig, attempt: int, drill_id: str) -> str:
    """What the local backend runs for an attempt (it has no batch script): ``faultdrill render``."""
    launch = LocalLaunch.of(run, attempt, drill_id)
    what = (f"mpiexec starts the {run.ranks} ranks" if launch.prefix else
            f"each task is one rank or warm spare ({run.ranks} ranks)" if launch.tasks > run.ranks else
            "each task is one rank")
    lines = [
        f"# local backend: no batch script. submitit's local executor ({LOCAL_CONTROLLER_MODULE}) runs",
        f"# {launch.tasks} task(s) of this command in {run.paths.submitit}, {_minutes(run):g} min time limit;",
        f"# {what}, every one with this environment:",
        *(f"export {name}={shlex.quote(value)}" for name, value in sorted(launch.environment.items())),
        shlex.join([*launch.prefix, *task_command(), str(run.paths.submitit)]),
    ]
    return "\n".join(lines) + "\n"


def mpi_launcher(ranks: int, runtime: MpiRuntime, survivors_stay: bool = False) -> list[str]:
    """Open MPI's launch of ``ranks`` local ranks (experiments/launchers.py): the prefix of the
    job's one task, which starts the ranks (a warm set's: a dead rank leaves the others running)."""
    if survivors_stay and runtime.prrte is None:  # the site's: its release says which flag keeps them
        runtime = runtime_here(runtime.program)
    return argv(Mpiexec(runtime=runtime, survivors_stay=survivors_stay).words(Launch(command=[], tasks=ranks)))


def _all_tasks_succeeded(record: LocalJobRecord, job_id: str) -> bool:
    if warm_completed(record.folder, job_id):
        return True  # a warm job: a task that died was replaced, and the run completed
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
        cmdline = _cmdline(psutil.Process(int(job_id)))
    except (psutil.NoSuchProcess, ValueError):
        cmdline = []
    if LOCAL_CONTROLLER_MODULE in cmdline and str(record.folder) in cmdline:
        return JobState.RUNNING
    return JobState.COMPLETED if _all_tasks_succeeded(record, job_id) else JobState.UNKNOWN


def _outlives_its_tasks(controller: psutil.Process) -> bool:
    """A job controller that starts processes after its tasks end: in-allocation's, which relaunches
    on a go; warm's, whose coordinator starts spares and plans generations. A cancel ends it too."""
    environment = _environ(controller)
    return ENV_RELAUNCH_WAIT_S in environment or ENV_WARM_WORLD in environment


def _minutes(run: RunConfig) -> float:
    return time_limit_minutes(run.campaign.resources.time)


KILL_DEADLINE_S = 2.0  # a launcher may start children while its tree is killed: look again until then


def kill_tree(root: psutil.Process, include_root: bool, attempt: int | None = None,
              born_before: int | None = None) -> None:
    """SIGKILL every descendant of ``root`` (and ``root`` itself if asked) until none is left
    alive: zombies count as gone (their parent reaps them), so no time is spent waiting on them.
    With ``attempt``, only the processes of that attempt (their environment names it): an
    in-allocation job may already be starting the next attempt's ranks; with ``born_before`` (a
    ``ticks_now()``), only processes started before then. A root that is to die is stopped first, so that it starts
    nothing new while its tree is killed."""
    if include_root:
        _signal(root, psutil.Process.suspend)
    deadline = time.monotonic() + KILL_DEADLINE_S
    while time.monotonic() < deadline:
        victims = [p for p in _descendants(root) if _alive(p) and (attempt is None or _of_attempt(p, attempt))
                   and (born_before is None or _born_before(p, born_before))]
        if not victims:
            break
        for victim in victims:
            _signal(victim, psutil.Process.kill)
        time.sleep(0.01)
    if include_root:
        _signal(root, psutil.Process.kill)


def _signal(process: psutil.Process, action: Callable[[psutil.Process], None]) -> None:
    try:
        action(process)
    except psutil.NoSuchProcess:
        pass


def _born_before(process: psutil.Process, ticks: int) -> bool:
    """Started in a tick before ``ticks`` (the clock counts in 10 ms ticks): ``ticks`` is when the
    controller decided, before the next attempt's go, so a process started within that tick may
    already be the relaunch's; the ranks to kill had been running for seconds."""
    started = start_ticks(process.pid)
    return started is not None and started < ticks


def _of_attempt(process: psutil.Process, attempt: int) -> bool:
    return _environ(process).get(ENV_ATTEMPT) == str(attempt)


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _local_controllers(folder: Path) -> list[psutil.Process]:
    """Live submitit local controllers started for ``folder`` (the run's submitit folder)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if LOCAL_CONTROLLER_MODULE in cmdline and str(folder) in cmdline:
            found.append(process)
    return found


def _environment_names(process: psutil.Process, run_id: str, attempt: int | None, drill_id: str) -> bool:
    """The process was started by this drill for this run (and attempt): its environment says so."""
    environ = _environ(process)
    return (environ.get(ENV_RUN_ID) == run_id and environ.get(ENV_DRILL_ID) == drill_id
            and (attempt is None or environ.get(ENV_ATTEMPT) == str(attempt)))


def _environ(process: psutil.Process) -> dict[str, str]:
    """The process's environment; empty if it is gone or cannot be read."""
    try:
        return process.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {}


def _recorded_job_ids(paths: RunPaths, attempt: int) -> list[str]:
    """The job id the attempt's rank 0 recorded when it started (its process_start event)."""
    ids = {str(event.fields["job_id"]) for event in read_attempt_events(paths, attempt)
           if event.name == EVENT_PROCESS_START and event.fields.get("job_id")}
    return sorted(ids, key=lambda job_id: int(job_id) if job_id.isdigit() else 0)
