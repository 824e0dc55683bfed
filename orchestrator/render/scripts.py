"""Render batch scripts from the Jinja templates in ``templates/`` (or a user template by path)."""

from __future__ import annotations

import hashlib
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from experiments.launchers import Launch, Mpiexec, Shell, Srun, Word, script_line, site_release_lines
from experiments.layout import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_TIMEOUT_S,
    ENV_DRILL_ID,
    ENV_JOB_ID,
    ENV_MASTER_ADDR,
    ENV_RANK_HOSTS,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    EVENT_JOB_START,
    EVENT_STEP_EXIT,
    RANK_STEP_NAME,
    RELAUNCH_EXCLUDE_NAME,
    SCRIPT_EVENTS_FILE_NAME,
)
from experiments.layout import ENV_WARM_RESTART_ALL as WARM_RESTART_ALL
from experiments.layout import ENV_WARM_SPARES as WARM_SPARES
from experiments.layout import ENV_WARM_WORLD as WARM_WORLD
from experiments.workloads import LAUNCHER_MPI
from orchestrator.campaign.directives import parse_directive, slurm_line
from orchestrator.campaign.mpi import ROOT_ENVIRONMENT, launch_environment
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import time_limit_minutes

SLURM_TEMPLATE = "slurm.sbatch.j2"


class TemplateError(ValueError):
    """A template could not be rendered: names the template and the problem."""


def shell_quote(value: Any) -> str:
    return shlex.quote(str(value))


def directive_value(value: Any) -> str:
    """A value for a ``#SBATCH``/``#PBS`` line: one line; quoted when it holds blanks or quotes."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise TemplateError(f"directive value {text!r} holds a line break; directives are one line")
    if any(char in text for char in " \t'\"\\"):
        if '"' in text:
            raise TemplateError(f"directive value {text!r} holds a double quote, which sbatch cannot parse")
        return f'"{text}"'
    return text


def _environment(user_template: Path | None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = [jinja2.PackageLoader("templates", ".")]
    if user_template is not None:
        loaders.insert(0, jinja2.FileSystemLoader(str(user_template.parent)))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["directive"] = directive_value
    return env


# The contract's names a batch script writes (experiments/layout.py), as every template gets them.
TEMPLATE_CONTRACT = {
    "env": {"ATTEMPT": ENV_ATTEMPT, "JOB_ID": ENV_JOB_ID, "MASTER_ADDR": ENV_MASTER_ADDR, "RANK_HOSTS": ENV_RANK_HOSTS,
            "DRILL_ID": ENV_DRILL_ID},
    "event": {"job_start": EVENT_JOB_START, "step_exit": EVENT_STEP_EXIT},
    # The batch script's events file (a user's template too: never rank 0's file, which rank 0 alone writes)
    "file": {"events": SCRIPT_EVENTS_FILE_NAME, "relaunch_exclude": RELAUNCH_EXCLUDE_NAME},
}


def render_template(name: str, context: dict[str, Any], user_template: Path | None = None) -> str:
    env = _environment(user_template)
    template_name = user_template.name if user_template is not None else name
    try:
        return env.get_template(template_name).render(**{"contract": TEMPLATE_CONTRACT, **context})
    except jinja2.UndefinedError as error:
        raise TemplateError(f"template {template_name}: {error.message} (variables: {sorted(context)})") from None
    except jinja2.TemplateError as error:
        raise TemplateError(f"template {template_name}: {error}") from None


@dataclass(frozen=True)
class SubmissionScript:
    """A rendered batch script and what it needs to run: submit it from ``submit_dir``."""

    text: str
    submit_dir: Path
    environment: dict[str, str] = field(default_factory=dict)


def rank_environment(run: RunConfig, attempt: int, drill_id: str) -> dict[str, str]:
    """What every rank process of the attempt is started with (the injector checks the first two)."""
    environment = {
        ENV_RUN_ID: run.run_id,
        ENV_RUN_DIR: str(run.paths.root),
        ENV_ATTEMPT: str(attempt),
        ENV_DRILL_ID: drill_id,
        ENV_CHECKPOINT_TIMEOUT_S: f"{run.campaign.restart.checkpoint_timeout_s:g}",
        **dict(run.workload_entry.environment),
    }
    if run.mpi_launched:
        environment.update(launch_environment(run.mpi, dict(run.workload_entry.environment) | run.campaign.workload.env))
    if run.strategy_traits.warm:
        environment.update({WARM_WORLD: str(run.ranks), WARM_SPARES: str(run.campaign.restart.warm_spares)})
        if run.warm_restarts_all:
            environment[WARM_RESTART_ALL] = "1"
    return environment


JOB_NAME_LIMIT = 120  # characters; PBS Pro allows 236, Slurm more; shorter reads better in squeue


def attempt_job_name(run: RunConfig, attempt: int, drill_id: str) -> str:
    """Unique per drill, run and attempt: a restarted controller finds an unrecorded job by it."""
    return unique_job_name(f"fd-{drill_id}-{run.run_id}", f"-a{attempt}")


def array_job_name(runs: list[RunConfig], attempt: int, drill_id: str) -> str:
    """The name of one array of ``runs`` (their first attempts): unique per drill and set of runs."""
    members = hashlib.sha256("/".join(run.run_id for run in runs).encode()).hexdigest()[:8]
    return unique_job_name(f"fd-{drill_id}-{runs[0].run_id}-x{len(runs)}-{members}", f"-a{attempt}")


def unique_job_name(stem: str, suffix: str) -> str:
    """``stem + suffix``, or, past JOB_NAME_LIMIT, the stem cut short with a digest of all of it (so
    two long names that share their start, such as a run and its -baseline twin, stay apart)."""
    name = stem + suffix
    if len(name) <= JOB_NAME_LIMIT:
        return name
    digest = hashlib.sha256(stem.encode()).hexdigest()[:10]
    tail = f"-{digest}{suffix}"
    return stem[: JOB_NAME_LIMIT - len(tail)] + tail


def task_command(python: str = sys.executable) -> list[str]:
    """What a task of a job runs on every backend (its submitit folder follows: the batch script, or
    the local executor, gives it): submitit's pickled call, run without loading submitit where the
    scheduler names the job (experiments/task.py), through submitit's runner on the local backend."""
    return [python, "-u", "-m", "experiments.task"]


def rank_step_name(attempt: int) -> str:
    """The name of ``attempt``'s rank step under in-allocation (the batch script appends the attempt)."""
    return f"{RANK_STEP_NAME}-{attempt}"


def _relaunch_context(run: RunConfig) -> dict[str, Any]:
    """What a batch template's relaunch loop needs (templates/relaunch.sh.j2)."""
    return {"in_allocation": run.strategy_traits.relaunches_in_job,
            "relaunch_wait_s": int(math.ceil(run.campaign.restart.relaunch_wait_s))}


@dataclass(frozen=True)
class SlurmElement:
    """What one job (or one array element) of a Slurm script runs: its run's variables and folder."""

    attempt: int
    fence_file: Path
    attempts_root: Path
    folder: Path
    environment: dict[str, str]
    index: int | None = None


def _slurm_element(run: RunConfig, attempt: int, drill_id: str, index: int | None) -> SlurmElement:
    return SlurmElement(attempt=attempt, fence_file=run.paths.current_attempt, attempts_root=run.paths.root / "attempts",
                        folder=run.paths.submitit, index=index,
                        environment={**rank_environment(run, attempt, drill_id), "SUBMITIT_EXECUTOR": "slurm"})


FOLDER = Shell('"$folder"')  # the batch script's variable: the submitit folder its task runs from
REPO = Path(__file__).resolve().parents[2]  # the rank runtime's code (experiments/, injectors/)


def container_options(run: RunConfig, python: str) -> tuple[str, ...]:
    """srun's pyxis options of the ranks' step (none without ``resources.container``): the image;
    mounted at the same paths, what the rank runtime needs inside (the repository, the interpreter's
    environment and the installation it links to, the workdir, the checkpoint directory) and the
    spec's own mounts."""
    container = run.campaign.resources.container
    if container is None:
        return ()
    interpreter = Path(python)
    needed = [REPO, interpreter.parent.parent, interpreter.resolve().parent.parent, run.campaign.workdir,
              run.campaign.checkpoint.every_runs_directory]
    own = [f"{path}:{path}" for path in dict.fromkeys(str(path) for path in needed if path is not None)]
    return (f"--container-image={container.image}", f"--container-mounts={','.join([*own, *container.mounts])}",
            *([f"--container-workdir={container.workdir}"] if container.workdir else []))


@dataclass(frozen=True)
class SlurmScriptRequest:
    """Everything ``slurm.sbatch.j2`` is rendered from, typed: ``nodes`` and ``tasks_per_node`` are
    the allocation's (spare nodes, warm spares' slots included), ``step_nodes`` and ``ranks`` the
    ranks' own; an ``array`` ("0-19%4") runs element i at index i; ``in_allocation``: the job
    launches its ranks again for the controller's next attempt; ``warm``: the warm coordinator
    launches the ranks and the spares."""

    job_name: str
    elements: tuple[SlurmElement, ...]
    python: str
    nodes: int
    tasks_per_node: int
    step_nodes: int
    ranks: int  # the tasks of the ranks' launch (a torchrun per node: the nodes)
    time: str
    warning_s: int
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    array: str | None = None
    requeue: bool = False
    exclude: tuple[str, ...] = ()
    extra_directives: tuple[str, ...] = ()
    mpi: bool = False
    in_allocation: bool = False
    relaunch_wait_s: int = 60
    warm: WarmLaunch | None = None
    container: tuple[str, ...] = ()  # srun's pyxis options of the ranks' step
    setup: tuple[str, ...] = ()  # workload.setup: shell lines before the launch (srun passes the environment on)

    def context(self) -> dict[str, Any]:
        """The template's variables."""
        # An array's script and logs sit in the campaign's arrays folder; an element works in its run's.
        stem = "%A_%a" if self.array else "%j"
        rank_output, rank_error = f"{stem}_%t_log.out", f"{stem}_%t_log.err"
        return {
            "rank_launch": self._rank_launch(rank_output, rank_error),
            "job_name": self.job_name, "array": self.array, "elements": list(self.elements),
            "requeue": self.requeue, "nodes": self.nodes, "tasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task, "gpus_per_node": self.gpus_per_node,
            "warm": self.warm, "python": self.python, "step_nodes": self.step_nodes,
            # A user template's own launch block may still want these (ours takes rank_launch).
            "step_tasks": self.ranks, "rank_step_name": RANK_STEP_NAME,
            "in_allocation": self.in_allocation, "relaunch_wait_s": self.relaunch_wait_s,
            "time": self.time, "warning_s": self.warning_s, "partition": self.partition,
            "exclude": ",".join(self.exclude),
            "extra_directives": [slurm_line(parse_directive(text)) for text in self.extra_directives],
            "stdout_name": f"{stem}_batch.out", "stderr_name": f"{stem}_batch.err",
            "rank_output": rank_output, "rank_error": rank_error,
            "command": task_command(self.python), "mpi": self.mpi, "setup": list(self.setup),
            "setup_forwarded": [],
        }

    def _rank_launch(self, output: str, error: str) -> str:
        """The ranks' srun (experiments/launchers.py): one step of the job's tasks; under in-allocation
        named with its attempt (the controller ends a hung one alone), sharing the CPUs of a failed
        step still held (``--overlap``: a dead node's), off the nodes in ``$exclude``."""
        command: list[Word] = [*task_command(self.python), FOLDER]
        mpi = "pmix" if self.mpi else ""
        if not self.in_allocation:
            return script_line(Srun(), Launch(command, output=output, error=error, mpi=mpi, options=self.container))
        launch = Launch(command, tasks=self.ranks, nodes=self.step_nodes,
                        name=Shell(f'{shlex.quote(RANK_STEP_NAME)}-"$attempt"'), output=output, error=error, mpi=mpi,
                        overlap=True, exclude_from="exclude", options=self.container)
        return script_line(Srun(), launch, indent="  ")


def _slurm_request(run: RunConfig, job_name: str, elements: list[SlurmElement], python: str,
                   exclude_nodes: tuple[str, ...], array: str | None) -> SlurmScriptRequest:
    resources = run.campaign.resources
    relaunch = _relaunch_context(run)
    return SlurmScriptRequest(
        job_name=job_name, elements=tuple(elements), python=python, array=array,
        nodes=resources.nodes + resources.spare_nodes,
        tasks_per_node=run.launch_tasks_per_node + run.warm_spares,  # warm: the spares' task slots too
        cpus_per_task=_cpus_per_task(run), gpus_per_node=resources.gpus_per_node,
        step_nodes=resources.nodes, ranks=resources.nodes * run.launch_tasks_per_node, time=resources.time,
        warning_s=resources.warning_s, partition=resources.partition, requeue=run.scheduler_requeue,
        exclude=exclude_nodes, extra_directives=tuple(resources.extra_directives),
        mpi=run.workload_entry.launcher == LAUNCHER_MPI, in_allocation=relaunch["in_allocation"],
        relaunch_wait_s=relaunch["relaunch_wait_s"], warm=_warm_launch(run), container=container_options(run, python),
        setup=tuple(run.campaign.workload.setup))


def _cpus_per_task(run: RunConfig) -> int:
    """A torchrun task starts the node's ranks: it holds a CPU for each (one task per rank otherwise)."""
    return run.campaign.resources.tasks_per_node if run.torchrun else 1


# The variables a workload.setup typically changes (modules, a venv, conda), passed on to every rank
# by PBS's mpiexec (-x: a remote rank gets nothing else); a set-up that sets others: workload.env.
SETUP_FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")


@dataclass(frozen=True)
class WarmLaunch:
    """restart.strategy warm: what the job's coordinator launches on each node, and the spare sets
    (TensorFlow, Chainer; 0 for PyTorch, whose spares replace single ranks)."""

    ranks_per_node: int
    spares_per_node: int
    spare_sets: int


def _warm_launch(run: RunConfig) -> WarmLaunch | None:
    """The warm launch of ``run``; None under the other strategies."""
    if not run.strategy_traits.warm:
        return None
    return WarmLaunch(ranks_per_node=run.campaign.resources.tasks_per_node, spares_per_node=run.warm_spares,
                      spare_sets=run.campaign.restart.warm_spares if run.warm_restarts_all else 0)


def render_slurm(run: RunConfig, attempt: int, drill_id: str, python: str = sys.executable,
                 exclude_nodes: tuple[str, ...] = ()) -> SubmissionScript:
    element = _slurm_element(run, attempt, drill_id, None)
    request = _slurm_request(run, attempt_job_name(run, attempt, drill_id), [element], python, exclude_nodes, None)
    text = render_template(SLURM_TEMPLATE, request.context(), run.campaign.template)
    return SubmissionScript(text=text, submit_dir=run.paths.submitit, environment=element.environment)


def render_slurm_array(attempts: list[tuple[RunConfig, int]], drill_id: str, job_name: str, parallelism: int,
                       python: str = sys.executable) -> SubmissionScript:
    """One Slurm array whose element i runs attempt ``attempts[i]`` (same resources for all)."""
    first = _same_resources(attempts)
    elements = [_slurm_element(run, attempt, drill_id, index) for index, (run, attempt) in enumerate(attempts)]
    array = f"0-{len(attempts) - 1}%{max(1, min(parallelism, len(attempts)))}"
    request = _slurm_request(first, job_name, elements, python, (), array)
    text = render_template(SLURM_TEMPLATE, request.context(), first.campaign.template)
    return SubmissionScript(text=text, submit_dir=first.campaign.workdir / "arrays")


def _same_resources(attempts: list[tuple[RunConfig, int]]) -> RunConfig:
    first = attempts[0][0]
    for run, _ in attempts[1:]:
        if run.campaign.resources != first.campaign.resources or run.campaign.template != first.campaign.template:
            raise TemplateError(f"run {run.run_id} needs other resources than {first.run_id}: not one array")
    return first


# --- PBS (Torque, PBS Pro) -----------------------------------------------------------------------

PBS_TEMPLATE = "pbs.j2"


def pbs_walltime(time_text: str) -> str:
    """A spec time limit ([D-]HH:MM:SS, MM:SS or minutes) as PBS's walltime HH:MM:SS."""
    seconds = round(time_limit_minutes(time_text) * 60)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def pbs_directive(extra: str) -> tuple[str, str]:
    """``-l mem=4gb`` -> (``-l``, ``mem=4gb``): a PBS option is one letter, then its value."""
    directive = parse_directive(extra)
    if directive.is_long:
        raise TemplateError(f"PBS directive {extra!r} is not a one-letter option such as '-l mem=4gb'")
    return directive.flag, directive.value or ""


@dataclass(frozen=True)
class PBSElement:
    """What one job (or one element of an array) runs: its submitit folder and its variables."""

    folder: Path
    environment: dict[str, str] = field(default_factory=dict)
    events_file: Path | None = None  # the batch script's own (script_events_file)
    index: int | None = None
    attempt: int | None = None  # with fence_file: the attempt this element runs (stale ones start nothing)
    fence_file: Path | None = None


@dataclass(frozen=True)
class PBSScriptRequest:
    """Everything ``pbs.j2`` is rendered from, typed: an ``array`` ("0-19%4") runs element i at
    index i; ``in_allocation``: the job launches its ranks again for the controller's next attempt;
    ``warning_s``: the batch script sends the ranks the warning signal this long before the walltime;
    ``warm``: the warm coordinator launches the ranks and the spares, whose processes take CPUs of
    each node beside the ranks'."""

    job_name: str
    nodes: int
    tasks_per_node: int
    walltime: str
    elements: tuple[PBSElement, ...]
    python: str
    flavor: str = "torque"
    queue: str | None = None
    mem: str | None = None
    array: str | None = None
    extra_directives: tuple[str, ...] = ()
    common_environment: dict[str, str] = field(default_factory=dict)
    rerunnable: bool = True
    output_stem: str | None = None
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    in_allocation: bool = False
    relaunch_wait_s: int = 60
    warning_s: int | None = None
    warm: WarmLaunch | None = None
    setup: tuple[str, ...] = ()  # workload.setup: shell lines before the launch (SETUP_FORWARDED passed on)

    def __post_init__(self) -> None:
        elements = self.elements
        single = len(elements) == 1 and elements[0].index is None
        if single != (self.array is None) or (self.array is not None and any(e.index is None for e in elements)):
            raise TemplateError("a PBS job has one element without an index; an array has indexed elements")

    def context(self) -> dict[str, Any]:
        """The template's variables."""
        common = {**ROOT_ENVIRONMENT, **self.common_environment, "SUBMITIT_EXECUTOR": "pbs"}
        names = set(common) | {ENV_MASTER_ADDR, ENV_RANK_HOSTS, ENV_JOB_ID} | {n for e in self.elements
                                                                              for n in e.environment}
        if self.setup:  # mpiexec gives a remote rank only what -x names: what a set-up changes
            names |= set(SETUP_FORWARDED)
        stem = self.output_stem or self.job_name
        spares_per_node = self.warm.spares_per_node if self.warm else 0
        # The ranks' mpiexec (experiments/launchers.py): every rank of the allocation, each -x
        # variable exported, its own session directory base ($ompi_tmp).
        launcher = Mpiexec(forwarded=sorted(names), session_dir=Shell('"$ompi_tmp"'))
        launch = Launch([*task_command(self.python), FOLDER], tasks=self.nodes * self.tasks_per_node,
                        tasks_per_node=self.tasks_per_node)
        return {
            "rank_launch": script_line(launcher, launch, indent="  " if self.in_allocation else ""),
            "job_name": self.job_name, "flavor": self.flavor, "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "cpus_per_node": (self.tasks_per_node + spares_per_node) * self.cpus_per_task,
            "gpus_per_node": self.gpus_per_node, "warm": self.warm,
            "ranks": self.nodes * self.tasks_per_node, "walltime": self.walltime, "queue": self.queue,
            "mem": self.mem, "array": self.array,
            "rerunnable": self.rerunnable, "stdout_name": f"{stem}.pbs.out", "stderr_name": f"{stem}.pbs.err",
            "in_allocation": self.in_allocation, "relaunch_wait_s": self.relaunch_wait_s,
            "warning_at_s": _warning_at_s(self.walltime, self.warning_s),
            "extra_directives": [pbs_directive(extra) for extra in self.extra_directives],
            "common_environment": common, "python": self.python, "command": task_command(self.python),
            "forwarded": sorted(names),
            "site_mpi_release": site_release_lines(),
            "setup": list(self.setup), "setup_forwarded": list(SETUP_FORWARDED) if self.setup else [],
            "elements": [{"index": e.index, "folder": str(e.folder), "events_file": str(e.events_file or ""),
                          "attempt": "" if e.attempt is None else e.attempt, "fence_file": str(e.fence_file or ""),
                          "environment": {k: v for k, v in e.environment.items() if k not in common}}
                         for e in self.elements],
        }


def _warning_at_s(walltime: str, warning_s: int | None) -> int | None:
    """Seconds after the job's start when the warning is due (None: no warning)."""
    if warning_s is None:
        return None
    return max(0, round(time_limit_minutes(walltime) * 60) - warning_s)


def _pbs_element(run: RunConfig, attempt: int, drill_id: str, index: int | None) -> PBSElement:
    return PBSElement(folder=run.paths.submitit, environment=rank_environment(run, attempt, drill_id),
                      events_file=run.paths.script_events_file(attempt), index=index, attempt=attempt,
                      fence_file=run.paths.current_attempt)


def _pbs_request(run: RunConfig, job_name: str, elements: list[PBSElement], python: str,
                 array: str | None) -> PBSScriptRequest:
    resources = run.campaign.resources
    relaunch = _relaunch_context(run)
    return PBSScriptRequest(
        job_name=job_name, nodes=resources.nodes, tasks_per_node=run.launch_tasks_per_node,
        cpus_per_task=_cpus_per_task(run), walltime=pbs_walltime(resources.time), elements=tuple(elements), python=python, flavor=resources.pbs_flavor,
        queue=resources.partition, array=array, extra_directives=tuple(resources.extra_directives),
        rerunnable=run.scheduler_requeue, warning_s=resources.warning_s, warm=_warm_launch(run),
        gpus_per_node=resources.gpus_per_node,
        in_allocation=relaunch["in_allocation"], relaunch_wait_s=relaunch["relaunch_wait_s"],
        setup=tuple(run.campaign.workload.setup),
    )


def render_pbs(run: RunConfig, attempt: int, drill_id: str, python: str = sys.executable) -> SubmissionScript:
    element = _pbs_element(run, attempt, drill_id, None)
    context = _pbs_request(run, attempt_job_name(run, attempt, drill_id), [element], python, None).context()
    text = render_template(PBS_TEMPLATE, context, run.campaign.template)
    environment = {**context["common_environment"], **element.environment}
    return SubmissionScript(text=text, submit_dir=run.paths.submitit, environment=environment)


def render_pbs_array(
    attempts: list[tuple[RunConfig, int]], drill_id: str, job_name: str, parallelism: int,
    python: str = sys.executable,
) -> SubmissionScript:
    """One PBS array whose element i runs attempt ``attempts[i]`` (same resources for all): each
    element exports its own run's variables and runs from its own run's submitit folder."""
    first = _same_resources(attempts)
    elements = [_pbs_element(run, attempt, drill_id, index) for index, (run, attempt) in enumerate(attempts)]
    array = f"0-{len(attempts) - 1}%{max(1, min(parallelism, len(attempts)))}"
    context = _pbs_request(first, job_name, elements, python, array).context()
    text = render_template(PBS_TEMPLATE, context, first.campaign.template)
    return SubmissionScript(text=text, submit_dir=first.campaign.workdir / "arrays",
                            environment=context["common_environment"])
