"""Expand a campaign into runs: one per sweep point, plus a fault-free baseline twin if asked."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from experiments.layout import (
    COORDINATOR_EVENTS_FILE_NAME,
    EVENT_FILE_NAMES,
    SUPERVISOR_EVENTS_FILE_NAME,
    CommandSpec,
    RunPaths,
    WorkloadSpec,
)
from experiments.warm.protocol import RESTART_ALL_FRAMEWORKS
from experiments.workloads import LAUNCHER_MPI, LAUNCHER_TORCHRUN, REGISTRY, WorkloadEntry, entry
from injectors.kinds import get_kind
from injectors.kinds.base import Site
from orchestrator.campaign.mpi import default_mpi
from orchestrator.campaign.placeholders import ATTEMPT_MARK, fill
from orchestrator.campaign.spec import (
    RUN_ID_FIELD,
    Campaign,
    SpecError,
    expanded_values,
    format_errors,
    time_limit_minutes,
)
from orchestrator.campaign.strategies import StrategyName, StrategyTraits, traits_of
from orchestrator.campaign.torchrun import PYTHON_NAMES, TorchrunCommand, TorchrunError, split_torchrun


@dataclass(frozen=True)
class RunConfig:
    """One run of a campaign, fully resolved: what the controller submits and watches."""

    run_id: str
    campaign: Campaign
    sweep_point: tuple[tuple[str, Any], ...]
    baseline_of: str | None = None  # this run is the fault-free twin of that run (the first to need it)
    twin: str | None = None  # this run's fault-free twin (shared by runs that differ only in faults)

    @property
    def is_baseline(self) -> bool:
        return self.baseline_of is not None

    @property
    def keeps_final_weights(self) -> bool:
        """Twins keep their final weights, so a digest mismatch can be measured, not just seen."""
        return self.campaign.baseline or self.is_baseline

    @property
    def fault_steps(self) -> tuple[int, ...]:
        """The steps the run's at_step faults name (its ranks write a heartbeat at once at each)."""
        named = {getattr(fault.after, "at_step", None) for fault in self.campaign.faults}
        return tuple(sorted(step for step in named if step is not None))

    @functools.cached_property
    def paths(self) -> RunPaths:
        """Made once (asked a dozen times a submission: 10,000 runs, 120,000 path joins)."""
        return RunPaths(self.campaign.workdir / "runs" / self.run_id)

    @property
    def faults_on_nodes(self) -> list[str]:
        """The run's fault kinds whose agent acts on a rank's node (a step of its job); those the
        controller carries out (scancel, scontrol, files) need none."""
        return [fault.kind for fault in self.campaign.faults if get_kind(fault.kind).site is Site.NODE]

    @property
    def checkpoint_root(self) -> Path | None:
        """The run's folder of checkpoint.directory ({run_id} filled in), which holds one folder
        per drill (checkpoint_home); None: checkpoints in the run directory."""
        directory = self.campaign.checkpoint.directory
        return Path(directory.replace(RUN_ID_FIELD, self.run_id)) if directory else None

    def checkpoint_home(self, drill_id: str) -> Path | None:
        """Where this drill keeps the run's checkpoints (a drill's own folder: a later drill of the
        same spec, or another workdir's, never resumes from them)."""
        root = self.checkpoint_root
        return root / drill_id if root is not None else None

    @property
    def ranks(self) -> int:
        return self.campaign.resources.nodes * self.campaign.resources.tasks_per_node

    @functools.cached_property
    def workload(self) -> WorkloadSpec:
        """What its ranks run (computed once: the progress display reads it every round)."""
        w = self.campaign.workload
        return WorkloadSpec(
            framework=w.framework, model=w.model, params=w.params, steps=w.steps, seed=w.seed,
            batch_size=w.batch_size, step_s=w.step_s, command=self.command,
        )

    @functools.cached_property
    def command(self) -> CommandSpec | None:
        """The user's script with this run's placeholders filled in (None: a built-in workload)."""
        w = self.campaign.workload
        if w.command is None:
            return None
        python = w.python or sys.executable
        values = self._placeholders()
        argv = [fill(text, values) for text in w.command]
        torchrun: tuple[str, ...] = ()
        if (launch := self.torchrun_launch(argv)) is not None:
            torchrun, argv = (*launch.program, *launch.options), list(launch.script)
        if argv[0] in PYTHON_NAMES:
            argv[0] = python
        return CommandSpec(
            torchrun=torchrun, torchrun_ranks=self.ranks if torchrun else 0, argv=tuple(argv), env=tuple((name, fill(text, values)) for name, text in sorted(w.env.items())),
            cwd=fill(w.cwd, values) if w.cwd else str(self.paths.script_cwd), progress=w.progress.mode, step_regex=w.progress.log or "",
            checkpoint_glob=fill(w.progress.checkpoints or "", values), checkpoint_step_regex=w.progress.step or "",
            resume_args=tuple(fill(text, values) for text in w.resume_args),
        )

    @property
    def outputs(self) -> list[str]:
        """workload.outputs with this run's placeholders filled in (relative to the script's cwd)."""
        w = self.campaign.workload
        return [fill(text, self._placeholders()) for text in w.outputs]

    @property
    def torchrun(self) -> bool:
        """The ranks are the workers of one torchrun per node (workload.launcher torchrun, or a
        command that starts torchrun)."""
        return self.campaign.workload.torchrun

    def torchrun_launch(self, argv: list[str] | None = None) -> TorchrunCommand | None:
        """The command (placeholders filled) split into torchrun, its kept options and the script;
        None unless the run is a torchrun's. TorchrunError when its options disagree with the spec."""
        if not self.torchrun:
            return None
        w = self.campaign.workload
        assert w.command is not None  # a torchrun run has a command
        words = argv if argv is not None else [fill(text, self._placeholders()) for text in w.command]
        resources = self.campaign.resources
        return split_torchrun(words, w.python or sys.executable, resources.nodes, resources.tasks_per_node)

    @property
    def launch_tasks_per_node(self) -> int:
        """The tasks the scheduler starts per node for the ranks: one torchrun per node (it starts
        the node's ranks), else one per rank."""
        return 1 if self.torchrun else self.campaign.resources.tasks_per_node

    def _placeholders(self) -> dict[str, Any]:
        """What a command's {placeholders} stand for in this run (orchestrator/campaign/placeholders.py)."""
        w = self.campaign.workload
        return {**self.campaign.args, "run_id": self.run_id, "run_dir": str(self.paths.root),
                "checkpoint_dir": str(self.paths.checkpoints), "attempt": ATTEMPT_MARK, "steps": w.steps,
                "seed": w.seed, "python": w.python or sys.executable,
                "checkpoint_every": self.campaign.checkpoint.every_steps}

    @property
    def model_name(self) -> str:
        """The built-in model, or the script a command workload runs (its file name)."""
        command = self.campaign.workload.command
        if command is None:
            return self.campaign.workload.model
        if self.torchrun:
            command = [word for word in self.command.argv if not word.startswith("-")] if self.command else command
        program = command[1] if command[0] in PYTHON_NAMES and len(command) > 1 else command[0]
        return f"script {program.rsplit('/', 1)[-1]}"

    @property
    def workload_entry(self) -> WorkloadEntry:
        w = self.campaign.workload
        if w.command is None:
            return entry(w.framework)
        # A script of a known framework needs what that framework's ranks need (chainer: MPI).
        known = REGISTRY.get(w.framework, WorkloadEntry(target=""))
        launcher = LAUNCHER_TORCHRUN if self.torchrun else w.launcher or known.launcher
        return WorkloadEntry(target="", launcher=launcher, environment=known.environment)

    @property
    def mpi(self) -> str:
        """The MPI its MPI launches use: workload.mpi, or the backend's (orchestrator/campaign/mpi.py)."""
        return self.campaign.workload.mpi or default_mpi(self.campaign.backend)

    @property
    def mpi_launched(self) -> bool:
        """Its ranks are started by an MPI launch: an MPI framework's, or any on PBS (mpiexec)."""
        return self.workload_entry.launcher == LAUNCHER_MPI or self.campaign.backend == "pbs"

    @functools.cached_property
    def event_writers(self) -> tuple[str, ...]:
        """The events files an attempt of this run may have (their names, EVENT_FILE_NAMES' order):
        the supervisor's where the workload is the user's command, the coordinator's where the
        strategy is warm; the batch script's and rank 0's always."""
        return tuple(name for name in EVENT_FILE_NAMES
                     if (name != SUPERVISOR_EVENTS_FILE_NAME or self.command is not None)
                     and (name != COORDINATOR_EVENTS_FILE_NAME or self.strategy_traits.warm))

    @property
    def strategy_traits(self) -> StrategyTraits:
        return traits_of(self.campaign.restart.strategy)

    @property
    def warm_restarts_all(self) -> bool:
        """restart.strategy warm on a framework whose collectives cannot drop a member (TensorFlow,
        Chainer): every rank restarts, in a warm spare set; ``restart.warm_spares`` counts sets."""
        return self.strategy_traits.warm and self.campaign.workload.framework in RESTART_ALL_FRAMEWORKS

    @property
    def warm_spares(self) -> int:
        """Processes per node the job holds beside its ranks (restart.strategy warm), 0 otherwise:
        ``restart.warm_spares``, or that many whole sets of ``tasks_per_node`` (restart-all)."""
        restart = self.campaign.restart
        if not self.strategy_traits.warm:
            return 0
        return restart.warm_spares * (self.campaign.resources.tasks_per_node if self.warm_restarts_all else 1)

    @property
    def local_tasks(self) -> int:
        """The tasks the local backend's job starts: one MPI launcher or one torchrun (it starts the
        ranks); the ranks and the warm spares; restart-all: one set's (the job starts the others itself)."""
        if self.workload_entry.launcher in (LAUNCHER_MPI, LAUNCHER_TORCHRUN):
            return 1
        return self.ranks + (0 if self.warm_restarts_all else self.warm_spares)

    @property
    def scheduler_requeue(self) -> bool:
        """Whether the scheduler may requeue this run's jobs itself (Slurm's JobRequeue, PBS -r y).
        Off: a requeued job would run an attempt the controller already replaced. (Fencing stops
        such a stale attempt anyway; this keeps it from being queued at all.) On for the requeue
        strategy only, where the requeued job *is* the next attempt (the fence names it first)."""
        return self.strategy_traits.scheduler_requeues


def expand_runs(campaign: Campaign) -> list[RunConfig]:
    """All runs of the campaign in a stable order; every sweep point is re-validated as a spec."""
    runs: list[RunConfig] = []
    twins: dict[str, str] = {}  # what a fault-free run trains (_twin_key) -> the twin run that trains it
    _check_sweep_size(campaign)
    points = [(point, _varying(grid)) for grid in campaign.sweep.grids for point in _grid_points(grid)]
    for index, (point, varying) in enumerate(points):
        point_campaign = _apply_point(campaign, point)
        run_id = _run_id(index, tuple((key, value) for key, value in point if key in varying))
        if not point_campaign.baseline:
            runs.append(RunConfig(run_id=run_id, campaign=point_campaign, sweep_point=point))
            continue
        twin = _fault_free(point_campaign)
        key = _twin_key(twin)
        known = key in twins
        twin_id = twins.setdefault(key, f"{run_id}-baseline")
        runs.append(RunConfig(run_id=run_id, campaign=point_campaign, sweep_point=point, twin=twin_id))
        if not known:
            runs.append(RunConfig(run_id=twin_id, campaign=twin, sweep_point=point, baseline_of=run_id))
    for run in runs:
        if run.torchrun:
            _check_torchrun(run)
    _check_cwds_apart(runs)
    return _twins_live_longest(runs)


def _check_torchrun(run: RunConfig) -> None:
    """A torchrun command whose options disagree with the spec (its run's resources): refused at load."""
    try:
        run.torchrun_launch()
    except TorchrunError as error:
        raise SpecError(str(error)) from None


def _check_cwds_apart(runs: list[RunConfig]) -> None:
    """A working directory several runs share (and so their twin) is one they read each other's files
    from: every framework whose resume is automatic picks another run's checkpoints up there."""
    by_cwd: dict[str, list[str]] = {}
    for run in runs:
        workload, command = run.campaign.workload, run.command
        if command is not None and workload.cwd and not workload.cwd_shared:
            by_cwd.setdefault(command.cwd, []).append(run.run_id)
    shared = {cwd: ids for cwd, ids in by_cwd.items() if len(ids) > 1}
    if shared:
        cwd, ids = next(iter(shared.items()))
        raise SpecError(f"workload.cwd: runs {', '.join(ids[:6])}{' ...' if len(ids) > 6 else ''} would all run in "
                        f"{cwd}, and read each other's files there (a relative checkpoint path, an automatic "
                        "resume); leave workload.cwd unset (each run gets a directory of its own), give it a "
                        "{run_id} or {run_dir}, or set workload.cwd_shared: true if the script writes nothing there")


def _twins_live_longest(runs: list[RunConfig]) -> list[RunConfig]:
    """Each twin with the longest time limit of the runs that share it: a run whose short limit is
    its fault (a walltime drill) must not end its fault-free twin the same way."""
    longest: dict[str, str] = {}
    for run in runs:
        if run.twin is not None:
            time = run.campaign.resources.time
            if run.twin not in longest or time_limit_minutes(time) > time_limit_minutes(longest[run.twin]):
                longest[run.twin] = time
    return [run if run.run_id not in longest else dataclasses.replace(run, campaign=run.campaign.model_copy(
        update={"resources": run.campaign.resources.model_copy(update={"time": longest[run.run_id]})}))
        for run in runs]


def _fault_free(campaign: Campaign) -> Campaign:
    """The run that never fails: no faults, nothing held for a recovery (a new job if it fails
    naturally), no spare nodes. Every other resource stays: a job without --exclusive may get less
    memory at a site that confines it, and a script may size itself by the CPUs it is given."""
    return campaign.model_copy(update={
        "faults": [], "restart": campaign.restart.model_copy(update={"strategy": StrategyName.RESUBMIT}),
        "resources": campaign.resources.model_copy(update={"spare_nodes": 0})})


def _twin_key(twin: Campaign) -> str:
    """What a fault-free run trains: runs that differ only in their faults or their restart settings
    (how they would recover), their time limit or where their checkpoints are kept share one twin
    (the twin's are where the first run to need it keeps its own); other resources (nodes held alone,
    another node count) make a twin of their own."""
    return json.dumps(twin.model_dump(mode="json", exclude={"restart": True, "resources": {"time"},
                                                            "checkpoint": {"directory"}}), sort_keys=True)


def _varying(grid: dict[str, list[Any]]) -> set[str]:
    """The keys that tell a grid's points apart (and so name its runs)."""
    return {key for key, values in grid.items() if len(values) > 1}


MAX_SWEEP_POINTS = 100_000  # ten times the largest sweep the controller is built for (issue 29's 10,000)
MAX_SWEEP_VALUES = 50_000_000  # the points' copies of the spec together: 10,000 points of 5,000 values


def _check_sweep_size(campaign: Campaign) -> None:
    """A grid's points are the product of its lists: a few hundred bytes can ask for 10^8 runs; and
    every point is a copy of the spec: many points of a large spec (aliases written out) are as
    costly. Refused by the counts before any point is built."""
    points = sum(math.prod(len(values) for values in grid.values()) for grid in campaign.sweep.grids)
    if points > MAX_SWEEP_POINTS:
        raise SpecError(f"sweep: {points:,} points (the product of each grid's lists), more than "
                        f"{MAX_SWEEP_POINTS:,}: split the campaign, or sweep fewer values")
    most_per_point = MAX_SWEEP_VALUES // max(points, 1)
    if points > 1 and expanded_values(campaign.model_dump(exclude={"sweep"}), most_per_point) > most_per_point:
        raise SpecError(f"sweep: {points:,} points of a spec of more than {most_per_point:,} values each (every "
                        f"point is a copy of the spec; at most {MAX_SWEEP_VALUES:,} values in all): split the "
                        "campaign, or make the spec smaller")


def _grid_points(grid: dict[str, list[Any]]) -> list[tuple[tuple[str, Any], ...]]:
    if not grid:
        return [()]
    keys = list(grid)  # the spec's order: the run names read as the author wrote the grid
    for key in keys:
        if not grid[key]:
            raise SpecError(f"sweep.grid.{key}: empty list of values")
        if key.split(".", 1)[0] == "sweep":
            raise SpecError(f"sweep.grid.{key}: a grid cannot sweep the sweep itself; valid: any other key of "
                            "the spec (args.*, workload.*, resources.*, ...)")
    return [tuple(zip(keys, values, strict=False)) for values in itertools.product(*(grid[key] for key in keys))]


def _apply_point(campaign: Campaign, point: tuple[tuple[str, Any], ...]) -> Campaign:
    if not point:
        return campaign
    # Without the sweep: each point's copy of it made a sweep's expansion quadratic (10,000 points
    # dumped 10,000 values each).
    data = campaign.model_dump(mode="python", exclude={"sweep"})
    for dotted, value in point:
        _set_dotted(data, dotted, value)
    data["sweep"] = {"grid": {}}
    try:
        return Campaign.model_validate(data)
    except ValidationError as error:
        where = ", ".join(f"{k}={v!r}" for k, v in point)
        raise SpecError(f"sweep point {where} gives an invalid spec\n" + format_errors(error)) from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        free_form = depth == 1 and parts[0] == "args"  # the user's own parameters: any key
        if not isinstance(node, dict) or (part not in node and not free_form):
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            prefix = ".".join(parts[:depth]) or "top level"
            raise SpecError(f"sweep.grid: {dotted!r}: no key {part!r} at {prefix}; valid: {known}")
        if depth == len(parts) - 1:
            node[part] = value
        else:
            node = node[part]


def _run_id(index: int, point: tuple[tuple[str, Any], ...]) -> str:
    """``r<index>`` plus the point's scalar settings (lists and switches make poor names)."""
    label = "-".join(f"{key.split('.')[-1]}={value}" for key, value in point
                     if isinstance(value, (int, float, str)) and not isinstance(value, bool))
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:60]
    return f"r{index:03d}" + (f"-{slug}" if slug else "")
