"""What a fault kind acting from the controller may do to the one job it hits (``JobControl``):
scheduler actions through the backend, cluster actions through the project's cluster script (on
its own cluster only) or a command the spec names for a site's cluster."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from experiments.layout import CLUSTER_NAME_KEY, CLUSTER_NODES_KEY, RunPaths, write_json_atomic
from experiments.runtime.fence import read_fence
from injectors.actions import WalltimeSet
from injectors.kinds import get_kind
from injectors.kinds.disk_full import BALLAST_PREFIX, DiskFullOptions, fill_problem
from injectors.kinds.node_faults import NodeFaultOptions
from injectors.kinds.oom_rank import OomRankOptions
from injectors.targets import TargetRefused
from orchestrator.backends.base import NotSupported
from orchestrator.campaign.capabilities import Capability
from orchestrator.commands import CommandError, run_command, user_name
from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend
    from orchestrator.campaign.runs import RunConfig

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "cluster"
CLUSTER_ENV = Path("/var/lib/faultdrill-cluster/cluster.env")
CLUSTER_ACTIONS = ("node-crash", "node-restore", "partition", "heal")
CLUSTER_TIMEOUT_S = 90.0
MENDS_NAME = "owed-cluster-actions.json"

log = logging.getLogger(__name__)


@dataclass
class BackendJobControl:
    backend_impl: "Backend"
    job_id: str
    # Signals every verified rank of the attempt through the fault agent: for a scheduler that
    # cannot signal a job's steps (the local backend).
    signal_by_agent: Callable[[str], None]
    menders: "Menders"
    on_acted: Callable[[float, str], None] = lambda at, node: None
    # The run's files and the attempt the fault is aimed at: under a same-job strategy the job runs
    # on as the next attempt, which a late fault must not hit. None: the job alone is checked.
    fence: tuple[RunPaths, int] | None = None
    # The job's state as the controller's rate-limited poller last heard it (None: the controller
    # no longer watches this job): a fault that checks the job often (verify_running(fresh=False))
    # asks no scheduler of its own; one about to act asks it (a stale RUNNING must not requeue an
    # ended job).
    known_state: Callable[[], JobState | None] = lambda: None
    _nodes: list[str] | None = None  # the allocation does not change: asked once

    @property
    def backend(self) -> str:
        return self.backend_impl.name

    def verify_running(self, fresh: bool = True) -> None:
        state = None if fresh else self.known_state()
        if state is None:  # before an act, or a job not watched any more: the scheduler is asked
            state = self.backend_impl.poll([self.job_id])[self.job_id]
        if state is not JobState.RUNNING:
            raise TargetRefused(f"job {self.job_id} is {state.value}, not running", gone=state.is_terminal)
        if self.fence is not None:
            paths, attempt = self.fence
            current = read_fence(paths)
            if current is None or current.attempt != attempt:
                now = f"attempt {current.attempt}" if current is not None else "no attempt"
                raise TargetRefused(f"job {self.job_id} runs {now} of the run now, not attempt {attempt}: "
                                    "the fault came after its attempt", gone=True)

    def signal_ranks(self, signal_name: str) -> None:
        if self.backend_impl.offers(Capability.SIGNAL_RANKS):
            self.backend_impl.signal_ranks(self.job_id, signal_name)
        else:
            self.signal_by_agent(signal_name)

    def cancel(self) -> None:
        self.backend_impl.cancel(self.job_id)

    def requeue(self) -> None:
        try:
            self.backend_impl.requeue(self.job_id)
        except NotSupported as error:
            raise TargetRefused(str(error)) from None

    def set_time_left(self, seconds: float) -> WalltimeSet:
        try:
            return self.backend_impl.set_time_left(self.job_id, seconds)
        except NotSupported as error:
            raise TargetRefused(str(error)) from None

    def nodes(self) -> list[str]:
        if self._nodes is None:
            try:
                self._nodes = self.backend_impl.job_nodes(self.job_id)
            except NotSupported as error:
                raise TargetRefused(str(error)) from None
        return list(self._nodes)

    def cluster(self, action: str, node: str, command: list[str] | None) -> str:
        argv = self._cluster_argv(action, node, command)
        try:
            return run_command(argv, timeout_s=CLUSTER_TIMEOUT_S).stdout.strip()
        except CommandError as error:
            raise TargetRefused(f"{action} {node} failed: {error}") from None

    def acted(self, at: float, node: str) -> None:
        self.on_acted(at, node)

    def mend_at_drill_end(self, action: str, node: str, command: list[str] | None) -> None:
        self.menders.add(self._mend(action, node, command))

    def mended(self, action: str, node: str, command: list[str] | None) -> None:
        self.menders.discharge(self._mend(action, node, command))

    def _mend(self, action: str, node: str, command: list[str] | None) -> Mend:
        return Mend(argv=self._cluster_argv(action, node, command), what=f"{action} {node}")

    def owe_removal(self, path: Path) -> None:
        """``path`` (a disk-full ballast) is removed at the end of the drill if nothing did before
        (a controller that died while it filled the checkpoint filesystem)."""
        self.menders.add(Mend(argv=[], what=f"remove {path}", remove=str(path)))

    def _cluster_argv(self, action: str, node: str, command: list[str] | None) -> list[str]:
        if action not in CLUSTER_ACTIONS:
            raise ValueError(f"unknown cluster action {action!r}; valid: {', '.join(CLUSTER_ACTIONS)}")
        allocation = self.nodes()
        if node not in allocation:
            raise TargetRefused(f"node {node!r} is not in job {self.job_id}'s allocation ({', '.join(allocation)})")
        return [part.replace("{node}", node) for part in command] if command else self._own_cluster(action, node)

    def _own_cluster(self, action: str, node: str) -> list[str]:
        """The project's cluster script, only on the cluster it made (its nodes, its name)."""
        nodes = _cluster_facts().get(CLUSTER_NODES_KEY, "").split()
        if self.backend_impl.name != "slurm" or node not in nodes or not on_own_cluster():
            raise TargetRefused(f"{action} on {node}: {NOT_OWN_CLUSTER}")
        return [str(CLUSTER_SCRIPT), action, node]


@dataclass(frozen=True)
class Mend:
    argv: list[str]  # a cluster action to run (empty: none)
    what: str
    remove: str | None = None  # a file to remove: a disk-full fault's ballast, only that


class Menders:
    """Actions owed at the end of the drill (a node down "for the rest of the drill", a ballast
    that fills the checkpoint filesystem until removed), kept in a file of the workdir so that a
    controller that died leaves them to the next one, which runs them first. One that fails stays
    owed and is tried again. A drill never leaves a node broken or a filesystem full behind it."""

    _lock = threading.Lock()  # one file per workdir; injector threads add, the controller runs

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / MENDS_NAME

    def add(self, mend: Mend) -> None:
        with self._lock:
            write_json_atomic(self.path, [*self._read(), asdict(mend)])

    def discharge(self, mend: Mend) -> None:
        """``mend`` was carried out by the fault itself (a timed node crash mended on time)."""
        with self._lock:
            owed = self._read()
            if asdict(mend) in owed:
                owed.remove(asdict(mend))
                if owed:
                    write_json_atomic(self.path, owed)
                else:
                    self.path.unlink(missing_ok=True)

    def run_all(self) -> list[str]:
        """Every owed action, each once; what each said (or why it failed). The failed ones stay owed."""
        with self._lock:
            said, failed = [], []
            for entry in self._read():
                mend = Mend(**entry)
                try:
                    if (done := _carry_out(mend)) is not None:
                        said.append(f"{mend.what}: {done}")
                except (CommandError, OSError) as error:
                    said.append(f"{mend.what}: FAILED: {error}")
                    log.error("could not %s at the end of the drill (owed until it works): %s", mend.what, error)
                    failed.append(entry)
            if failed:
                write_json_atomic(self.path, failed)
            else:
                self.path.unlink(missing_ok=True)
            return said

    def _read(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return []


def _carry_out(mend: Mend) -> str | None:
    """What the action said; None for a removal with nothing left to remove (the fault removed it)."""
    if mend.remove is not None:
        path = Path(mend.remove)
        if not path.name.startswith(BALLAST_PREFIX):
            raise OSError(f"{path} is no disk-full ballast ({BALLAST_PREFIX}*): not removed")
        if not path.exists():
            return None
        path.unlink()
        return "removed"
    return run_command(mend.argv, timeout_s=CLUSTER_TIMEOUT_S).stdout.strip()


NOT_OWN_CLUSTER = ("this is not the project's own cluster (scripts/cluster up), and the fault names no site "
                   "command for it; give one, e.g. `command: {act: [ipmitool, ..., '{node}'], mend: [...]}`")


def node_fault_refusals(runs: list[RunConfig]) -> list[str]:
    """Up front, not mid-drill: a node fault with no site command acts through scripts/cluster,
    which only the project's own cluster has (Slurm is asked once, and only if a run names one)."""
    named = {f"faults[{index}] ({fault.kind}): {NOT_OWN_CLUSTER}": None
             for run in runs if run.campaign.backend == "slurm"
             for index, fault in enumerate(run.campaign.faults)
             if isinstance(fault, NodeFaultOptions) and fault.command is None}
    return [] if not named or on_own_cluster() else list(named)


def privilege_refusals(runs: list[RunConfig], uid: int | None = None,
                       confines_memory: Callable[[RunConfig], bool] = lambda run: False) -> list[str]:
    """Up front, not mid-drill: what a drill that is not root cannot do (its jobs, and so its
    agents, run as the same user): the kinds that need root (``confines_memory``: whether the site's
    scheduler limits a job's memory, which spares oom-rank a cgroup of its own), and the node faults
    that act through scripts/cluster (network namespaces, daemons) rather than a site command."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return []
    who = f"you are {user_name(uid)} (uid {uid}), not root"
    own_cluster: bool | None = None  # asked only if a node fault needs it
    named: dict[str, None] = {}
    for run in runs:
        for index, fault in enumerate(run.campaign.faults):
            if (why := get_kind(fault.kind).root_needed(fault, partial(confines_memory, run))) is not None:
                named[f"faults[{index}] ({fault.kind}): {why}; {who}: leave it out, or drill as root"] = None
                continue
            if not (isinstance(fault, NodeFaultOptions) and fault.command is None and run.campaign.backend == "slurm"):
                continue
            own_cluster = on_own_cluster() if own_cluster is None else own_cluster
            if own_cluster:  # elsewhere node_fault_refusals says what is missing
                named[f"faults[{index}] ({fault.kind}): scripts/cluster acts on the node as root; {who}: "
                      "give the fault the site's own commands (command:), or drill as root"] = None
    return list(named)


def memory_limit_refusals(runs: list[RunConfig], confines_memory: Callable[[RunConfig], bool]) -> list[str]:
    """Up front: an oom-rank told to outgrow the job's memory limit (``limit: job``) where the site's
    scheduler sets none."""
    problems = []
    for run in runs:
        for index, fault in enumerate(run.campaign.faults):
            if isinstance(fault, OomRankOptions) and fault.limit == "job" and not confines_memory(run):
                problems.append(f"{run.run_id}: faults[{index}] (oom-rank): limit: job, but the scheduler here does "
                                "not confine this job's memory (Slurm: TaskPlugin task/cgroup with ConstrainRAMSpace=yes "
                                "(CgroupPlugin cgroup/v1, cgroup/v2 or autodetect), memory a consumable resource, and --mem "
                                "or a DefMemPer* default): "
                                "use limit: agent (root on the nodes) or auto")
    return problems


def disk_full_refusals(runs: list[RunConfig]) -> list[str]:
    """Up front, not mid-drill: disk-full fills the filesystem of its run's checkpoints only if it
    is small (at most max_fill_mb free), as seen from here (the nodes see the same shared one)."""
    problems = []
    for run in runs:
        for index, fault in enumerate(run.campaign.faults):
            if isinstance(fault, DiskFullOptions):
                directory = run.checkpoint_root or run.paths.checkpoints
                if (problem := fill_problem(directory, fault.max_fill_mb)) is not None:
                    problems.append(f"{run.run_id}: faults[{index}] (disk-full): {problem}")
    return problems


def on_own_cluster() -> bool:
    """The Slurm cluster here is the one scripts/cluster made (its facts file, and Slurm's ClusterName)."""
    return _is_own_slurm(_cluster_facts().get(CLUSTER_NAME_KEY, ""))


def _cluster_facts() -> dict[str, str]:
    try:
        text = CLUSTER_ENV.read_text()
    except OSError:
        return {}
    facts = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip().strip('"')
    return facts


_SLURM_CLUSTER_NAME: list[str] = []  # Slurm's ClusterName, once it answered


def _is_own_slurm(own_name: str) -> bool:
    """Slurm's ClusterName is the one the cluster script wrote (asked once per controller)."""
    if not own_name:
        return False
    if not _SLURM_CLUSTER_NAME:
        try:
            config = run_command(["scontrol", "show", "config"], timeout_s=20.0).stdout
        except CommandError:
            return False
        _SLURM_CLUSTER_NAME.extend(line.split("=", 1)[1].strip() for line in config.splitlines()
                                   if line.split("=", 1)[0].strip() == "ClusterName" and "=" in line)
    return bool(_SLURM_CLUSTER_NAME) and _SLURM_CLUSTER_NAME[0] == own_name
