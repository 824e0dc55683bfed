"""What every fault kind is: its options (one entry of the spec's ``faults``), what it targets,
where it acts, how its target is verified and what it records.

A kind that acts on ranks runs on their node, inside the job's allocation (the agent, started by
the backend: ``srun --overlap``, the PBS route, a local process). A kind that acts on files on
shared storage or through the scheduler or the cluster script acts from the controller.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from injectors.actions import WalltimeSet
from injectors.schedule import AtStep, Delay, ExponentialDelay

if TYPE_CHECKING:  # signals.py imports this module
    from injectors.kinds.signals import RankFaultOptions


class Target(str, Enum):
    RANK = "rank"
    NODE = "node"
    JOB = "job"
    CHECKPOINT = "checkpoint"


class Site(str, Enum):
    NODE = "node"  # the agent, on the target's node inside the job's allocation
    CONTROLLER = "controller"  # the login node: shared files, scheduler actions, the cluster script


class FaultOptions(BaseModel):
    """What every fault entry of a spec has; each kind adds its own options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    after: Delay = Field(default_factory=lambda: ExponentialDelay(exponential=10.0))
    # What ``after``'s delay counts from, in the attempt it fires in: its first training step, its
    # first checkpoint, or the moment every rank had started (start-up: import, rendezvous, resume).
    anchor: Literal["training_start", "first_checkpoint", "ranks_started"] = "training_start"
    # A failure model, not one fault: up to this many faults per run, one after the other, each
    # with a delay drawn afresh (the cap per run).
    repeat: int = Field(1, ge=1, le=1000)

    @model_validator(mode="after")
    def _one_fault_per_step(self) -> "FaultOptions":
        if isinstance(self.after, AtStep) and self.repeat != 1:
            raise ValueError("after.at_step names one step: it cannot repeat (use a delay for a failure model)")
        if isinstance(self.after, AtStep) and self.anchor != "training_start":
            raise ValueError(f"after.at_step is a training step: it takes no anchor ({self.anchor!r}); "
                             "give a delay (after: {seconds: S}) to count from it")
        return self

    def kind_options(self) -> dict[str, Any]:
        """The options the kind acts with (not when it fires): what the plan and the agent carry."""
        return self.model_dump(mode="json", exclude={"kind", "after", "anchor", "repeat"})


@dataclass(frozen=True)
class FaultOutcome:
    """What a fault did; ``at`` (when it acted) is the fault time of the recovery."""

    kind: str
    target: str  # e.g. "rank 1@fd-n2", "checkpoint step-00000040"
    at: float
    node: str = ""
    pid: int | None = None
    signal: str = ""
    detail: str = ""
    met_step: int | None = None  # an at_step fault: the step its agent saw when it acted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FaultTask:
    """One fault to act on: the run, the attempt and job it hits, the planned targets and options."""

    kind: str
    run_dir: Path
    run_id: str
    attempt: int
    job_id: str
    ranks: tuple[int, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    not_before: float = 0.0  # agents on several nodes act together at this wall time
    # An at_step fault's agent is started ahead of the step: it waits on the node until the attempt's
    # heartbeats reach this step, for at most wait_s (then it answers "not reached" and is started again).
    at_step: int | None = None
    wait_s: float = 0.0
    # Each node's clock minus the login node's, as the controller read them for the attempt: a
    # node's stamp t is t - offset on the login clock (a node not here: read as it is).
    clock_offsets: dict[str, float] = field(default_factory=dict)

    def on_login(self, moment: float, node: str) -> float:
        """``moment``, stamped on ``node``'s clock, on the login node's."""
        return moment - self.clock_offsets.get(node, 0.0)

    def on_node(self, moment: float, node: str) -> float:
        """``moment`` on the login node's clock, as ``node``'s clock reads it."""
        return moment + self.clock_offsets.get(node, 0.0)

    def to_json_dict(self) -> dict[str, Any]:
        return {**asdict(self), "run_dir": str(self.run_dir), "ranks": list(self.ranks)}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "FaultTask":
        return cls(**{**data, "run_dir": Path(data["run_dir"]), "ranks": tuple(data["ranks"])})


class JobControl(Protocol):
    """What a kind acting from the controller may do to the attempt's job (through the backend) and
    to the cluster (through the cluster script or a site's command). Bound to the one job the fault
    hits: a kind cannot name another."""

    job_id: str

    @property
    def backend(self) -> str:
        """"local" | "slurm" | "pbs" (read-only: the job's backend does not change)."""

    def verify_running(self, fresh: bool = True) -> None:
        """The job is the drill's attempt and the scheduler runs it; TargetRefused(gone) if it ended.
        ``fresh``: asked of the scheduler now (before an act: a cancel, a requeue); else as the
        controller's rate-limited poll last heard it (a loop that checks the job often)."""

    def signal_ranks(self, signal_name: str) -> None:
        """Send ``signal_name`` to every rank of the job, as a scheduler's warning does."""

    def cancel(self) -> None:
        """End the job through the scheduler."""

    def requeue(self) -> None:
        """Put the job back in the queue through the scheduler (it runs again, as sites preempt)."""

    def set_time_left(self, seconds: float) -> WalltimeSet:
        """Make the job reach its walltime about ``seconds`` from now, or, where the scheduler moves
        no running job's walltime (PBS), leave the job its own; what was set and when the end is due."""

    def nodes(self) -> list[str]:
        """The job's nodes according to the scheduler, in allocation order."""

    def cluster(self, action: str, node: str, command: list[str] | None) -> str:
        """Run a cluster action (node-crash, node-restore, partition, heal) on ``node`` of the job's
        allocation: the spec's site ``command`` if given, else the project's own cluster script
        (refused on any other cluster). Returns what it printed."""

    def mend_at_drill_end(self, action: str, node: str, command: list[str] | None) -> None:
        """Owe ``cluster(action, node, command)`` to the end of the drill (a node down for the rest
        of it): the controller runs it then, or the next controller if this one dies."""

    def mended(self, action: str, node: str, command: list[str] | None) -> None:
        """What ``mend_at_drill_end`` owed was carried out by the fault itself: no longer owed."""

    def owe_removal(self, path: Path) -> None:
        """Owe the removal of ``path`` (a disk-full ballast) to the end of the drill, before the
        file is made: a controller that dies while it fills the filesystem leaves it to the next."""

    def acted(self, at: float, node: str) -> None:
        """The fault has broken ``node`` at ``at`` (before it waits to mend it): the controller
        knows at once which node its attempt lost, and records it."""


class FaultKind(ABC):
    name: ClassVar[str]
    target: ClassVar[Target]
    site: ClassVar[Site]
    options: ClassVar[type[FaultOptions]]
    # True: the fault ends the attempt it hits (its effect is known once that attempt ended);
    # False: the attempt is meant to go on (a stall, a damaged file), the effect is known at once.
    ends_attempt: ClassVar[bool] = True
    works_on: ClassVar[tuple[str, ...]] = ("local", "slurm", "pbs")
    # True: an injected fault of this kind means the kernel's OOM killer ended its target (the
    # agent read the count): the injector's record the failure class reads (OUT_OF_MEMORY).
    oom_kill_record: ClassVar[bool] = False
    # True: an injected fault of this kind leaves its target stopped (hang-rank): a hang is its node's.
    stops_target: ClassVar[bool] = False
    # Set: the kind works only where the ranks keep their books through the rank API (built-in
    # workloads, command workloads with progress: api), and this says why (a zero-code spec error).
    needs_rank_api: ClassVar[str | None] = None
    # Set: the kind acts only as root on the nodes (the jobs run as the drill's user), and this
    # says why: a drill that is not root is refused it at plan.
    needs_root: ClassVar[str | None] = None

    def halts_target(self, signal_name: str) -> bool:
        """Whether an injected fault of this kind (with ``signal_name``, as its record says) leaves
        its target making no progress at all in its attempt: the report checks the ranks' own
        records for it (orchestrator/record/effects.py). Only what nothing can catch: SIGKILL,
        SIGSTOP, a node gone."""
        return False

    def root_needed(self, options: FaultOptions, confines_memory: Callable[[], bool]) -> str | None:
        """Why these options act only as root on the nodes (``needs_root`` by default); None: any
        user may. ``confines_memory``: whether the site's scheduler limits a job's memory itself."""
        return self.needs_root

    def plan_ranks(self, options: FaultOptions, world_size: int, rng: random.Random) -> tuple[int, ...]:
        """The ranks this fault will hit, drawn once when the drill is planned (none: not a rank kind)."""
        return ()

    def backend_problem(self, options: FaultOptions, backend: str) -> str | None:
        """Why these options cannot work on ``backend`` (a spec error), beyond ``works_on``; None: they can."""
        return None

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        """The planned target in words, for the plan and the report."""
        if not ranks:
            return self.target.value
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(str(rank) for rank in ranks)}"

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        """Verify and act, on the target's node (site NODE); raises TargetRefused if unverified."""
        raise NotImplementedError(f"{self.name} does not act on a node")

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        """Verify and act, from the controller (site CONTROLLER); raises TargetRefused if unverified."""
        raise NotImplementedError(f"{self.name} does not act from the controller")


class RankKind(FaultKind, ABC):
    """A kind that acts on rank processes: verified by identity file, pid, start time, uid and environment."""

    target = Target.RANK
    site = Site.NODE

    def plan_ranks(self, options: FaultOptions, world_size: int, rng: random.Random) -> tuple[int, ...]:
        from injectors.ranks import choose_ranks

        # Every rank kind's options are RankFaultOptions (they carry ``rank``).
        return choose_ranks(cast("RankFaultOptions", options).rank, world_size, rng)

    @abstractmethod
    def act_on_node(self, task: FaultTask) -> FaultOutcome: ...
