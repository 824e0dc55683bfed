"""The crash-point harness's parts (issue 21): the seams of the controller (every scheduler act,
fence write and ledger write) crossed through a counter that kills the controller right after the
N-th crossing, the drills it is killed in (three runs against tests/simulated_cluster.py), and the
invariants checked when a second controller has ended the drill. Two modes use them:
tests/unit/test_crash_points.py raises out of the controller (ControllerCrash);
tests/drill/test_crash_points_sigkill.py SIGKILLs a real controller process (tests/crash_child.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from fake_scheduler import ControllerCrash
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import load_campaign
from orchestrator.control import controller as controller_module
from orchestrator.control import same_job_attempts, submission, tracker
from orchestrator.control.controller import Controller
from orchestrator.record.ledger import Ledger
from simulated_cluster import HANG, KILL, PREEMPT, SimulatedCluster

LEDGER_WRITES = ("add_attempt", "update_attempt", "update_run", "set_meta", "add_checkpoints")
SCHEDULER_ACTS = ("submit", "submit_array", "cancel", "requeue")
FENCE_WRITERS = (controller_module, tracker, same_job_attempts, submission)  # every module of the controller that writes a fence
FENCE_WRITES = ("write_fence", "write_fence_unless_ahead", "fence_unless_moved_on")  # experiments.runtime.fence


@dataclass
class Crossings:
    """Counts the controller's side effects; raises ControllerCrash right after the ``crash_at``-th."""

    crash_at: int | None = None
    seen: list[str] = field(default_factory=list)
    crash: Callable[[str], None] | None = None  # how the controller dies (default: ControllerCrash raised)

    def crossed(self, seam: str) -> None:
        self.seen.append(seam)
        if len(self.seen) == self.crash_at:
            why = f"killed right after crossing {len(self.seen)}: {seam}"
            if self.crash is not None:
                self.crash(why)
            raise ControllerCrash(why)

    def after(self, seam: str, act: Callable[..., Any]) -> Callable[..., Any]:
        def crossing(*args: Any, **kwargs: Any) -> Any:
            result = act(*args, **kwargs)
            self.crossed(seam)
            return result
        return crossing


@dataclass(frozen=True)
class Drill:
    """A drill of three runs (r000, r001, r002): how the first attempts fail, and what the drill
    ends with (each run's status; the failure classes of each run's attempts, sorted)."""

    strategy: str
    failures: dict[tuple[int, int], str]  # (run index, attempt) -> how that attempt fails
    classes: list[str]
    statuses: tuple[str, ...] = ("completed", "completed", "completed")
    spec: dict[str, Any] = field(default_factory=dict)  # top-level fields over the common spec
    restart: dict[str, Any] = field(default_factory=dict)  # restart fields over the common spec


DRILLS = {
    # r001's launch exits 137 (a new job); r002 hangs (its job cancelled by the drill, a new job).
    "resubmit": Drill("resubmit", {(1, 0): KILL, (2, 0): HANG}, ["['HANG', None]", "['RANK_SIGNAL', None]", "[None]"]),
    # r001's launch exits 137; its job waits for the go and runs attempt 1.
    "in-allocation": Drill("in-allocation", {(1, 0): KILL}, ["['RANK_SIGNAL', None]", "[None]", "[None]"]),
    # r001 hangs: its launch is ended alone (a thread of the controller's), the job waits for the go.
    "in-allocation-hang": Drill("in-allocation", {(1, 0): HANG}, ["['HANG', None]", "[None]", "[None]"]),
    # r001's launch exits 137; the scheduler requeues the job, which runs again as attempt 1.
    "requeue": Drill("requeue", {(1, 0): KILL}, ["['RANK_SIGNAL', None]", "[None]", "[None]"]),
    # r001's rank dies; the job's coordinator re-forms it as attempt 1 (a spare takes the rank) and
    # fences it itself; the controller follows.
    "warm": Drill("warm", {(1, 0): KILL}, ["['RANK_SIGNAL', None]", "[None]", "[None]"]),
    # The first attempts go out as one job array; r001's element is killed, r002's preempted: single jobs follow.
    "array": Drill("resubmit", {(1, 0): KILL, (2, 0): PREEMPT},
                   ["['PREEMPTED', None]", "['RANK_SIGNAL', None]", "[None]"], spec={"submit_as_array": True}),
    # r001 fails every attempt its budget allows: it gives up (a new job each time).
    "give-up": Drill("resubmit", {(1, 0): KILL, (1, 1): KILL, (1, 2): HANG},
                     ["['RANK_SIGNAL', 'RANK_SIGNAL', 'HANG']", "[None]", "[None]"],
                     statuses=("completed", "gave_up", "completed")),
    # The same in one job: the job that waits for the go of an attempt that never comes is the drill's to cancel.
    "in-allocation-give-up": Drill("in-allocation", {(1, 0): KILL, (1, 1): KILL},
                                   ["['RANK_SIGNAL', 'RANK_SIGNAL']", "[None]", "[None]"],
                                   statuses=("completed", "gave_up", "completed"), restart={"max_restarts": 1}),
    # A policy backoff under the same-job strategies: in-allocation's go and requeue's request held for it.
    "in-allocation-backoff": Drill("in-allocation", {(1, 0): KILL}, ["['RANK_SIGNAL', None]", "[None]", "[None]"],
                                   restart={"policy": {"RANK_SIGNAL": {"backoff_s": 0.05}}}),
    "requeue-backoff": Drill("requeue", {(1, 0): KILL}, ["['RANK_SIGNAL', None]", "[None]", "[None]"],
                             restart={"policy": {"RANK_SIGNAL": {"backoff_s": 0.05}}}),
    # And under requeue: the failed job the next attempt would have been requeued as.
    "requeue-give-up": Drill("requeue", {(1, 0): KILL, (1, 1): KILL},
                             ["['RANK_SIGNAL', 'RANK_SIGNAL']", "[None]", "[None]"],
                             statuses=("completed", "gave_up", "completed"), restart={"max_restarts": 1}),
}


def spec_file(tmp_path: Path, drill: Drill) -> Path:
    spec = {
        "name": "crash-points", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"strategy": drill.strategy, "max_restarts": 2, "poll_interval_s": 0.002, "hang_timeout_s": 0.1,
                    **drill.restart},
        "parallel_runs": 2,
        "sweep": {"grid": {"workload.seed": [0, 1, 2]}},
        **drill.spec,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def world_for(spec: Path, drill: Drill, **options: Any) -> SimulatedCluster:
    runs = sorted(run.run_id for run in expand_runs(load_campaign(spec)))
    return SimulatedCluster(failures={(runs[index], attempt): failure
                                      for (index, attempt), failure in drill.failures.items()}, **options)


def install(setattr: Callable[[Any, str, Any], None], crossings: Crossings, world: SimulatedCluster) -> None:
    """Every seam of the controller crossed through ``crossings`` (``setattr``: pytest's
    monkeypatch.setattr, undone after the test, or the builtin in a process of its own)."""
    for name in LEDGER_WRITES:
        setattr(Ledger, name, crossings.after(f"ledger.{name}", getattr(Ledger, name)))
    for module in FENCE_WRITERS:
        for name in FENCE_WRITES:
            if hasattr(module, name):
                setattr(module, name, crossings.after("fence", getattr(module, name)))
    for name in SCHEDULER_ACTS:
        setattr(world, name, crossings.after(f"scheduler.{name}", getattr(world, name)))


def drive(spec: Path, world: SimulatedCluster) -> None:
    """One controller on the workdir until the drill ends (or a crossing kills it)."""
    controller = None
    try:
        controller = Controller(load_campaign(spec), backend=world)
        assert controller.run()
    finally:
        if controller is not None:
            controller.close()


def outcome(spec: Path) -> dict[str, tuple[str, str | None, int | None, list[str | None]]]:
    """Run id -> (status, final digest, the attempt the final record names, each attempt's class)."""
    ledger = Ledger.in_workdir(load_campaign(spec).workdir)
    try:
        return {row.run_id: (row.status, row.final_digest, final_attempt(spec, row.run_id),
                             [attempt.failure_class for attempt in ledger.attempts(row.run_id)])
                for row in ledger.runs()}
    finally:
        ledger.close()


def final_attempt(spec: Path, run_id: str) -> int | None:
    final = load_campaign(spec).workdir / "runs" / run_id / "final.json"
    return json.loads(final.read_text())["attempt"] if final.exists() else None


def check(world: SimulatedCluster, outcome: dict[str, Any], expected: dict[str, Any], where: str,
           backoff_s: float = 0.0) -> None:
    assert outcome == expected, where
    assert all(len(jobs) == 1 for jobs in world.ran.values()), f"an attempt ran two jobs: {world.ran} {where}"
    assert not world.against_fence, f"trained against the fence: {world.against_fence} {where}"
    assert not world.alive(), f"left on the scheduler: {world.alive()} {where}"
    for (run_id, attempt), failed_at in world.failed_at.items():  # a policy backoff was waited out
        began = world.began.get((run_id, attempt + 1))
        assert began is None or began >= failed_at + backoff_s, f"{run_id} {attempt + 1} began early {where}"


def backoff_of(drill: Drill) -> float:
    """The least policy backoff of the drill's restarts (the harness checks it was waited out)."""
    return min((entry.get("backoff_s", 0.0) for entry in drill.restart.get("policy", {}).values()), default=0.0)


@contextmanager
def crash_workdirs(fallback: Path) -> Iterator[Path]:
    """Where the drills' workdirs go: a tmpfs if there is one (the ledger's and the fences' fsyncs,
    hundreds of drills of them, cost nothing there), else ``fallback``."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield fallback
        return
    directory = Path(tempfile.mkdtemp(prefix="faultdrill-crash-points-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
