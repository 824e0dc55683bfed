"""The crash-point harness (issue 21): a drill of several runs against a simulated cluster
(tests/unit/simulated_cluster.py), its controller killed right after each side effect in turn —
every submission, cancel and requeue it asks of the scheduler, every fence it writes, every ledger
write — and a second controller started on the same workdir. N crossings in the drill without a
crash -> N drills, each checked against the invariants:

- every run ends as it would have without the crash;
- no attempt ever ran two jobs, and no job ran against the fence;
- no run is given up or classed CANCELLED because of the drill's own action;
- the final record and digest come from the run's last attempt;
- nothing is left on the scheduler.

Drilled (DRILLS): resubmit (a kill, a hang the drill cancels), in-allocation (a kill, the relaunch in
the same job on the controller's go), requeue (a kill, the same job requeued as the next attempt),
a job array (an element killed, one preempted), give-ups under resubmit, in-allocation and requeue
(the job the next attempt would have run in is the drill's to cancel), and a user's
``faultdrill cancel`` with runs in flight and one waiting. Not yet here (issue 21, next): warm (its
coordinator is a process of the job), the SIGKILL mode against a real process, the warm
coordinator's message-loss harness."""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from fake_scheduler import ControllerCrash
from simulated_cluster import HANG, KILL, PREEMPT, SimulatedCluster

from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import load_campaign
from orchestrator.control import same_job_attempts, tracker
from orchestrator.control.controller import Controller
from orchestrator.record.ledger import Ledger

pytestmark = pytest.mark.unit

LEDGER_WRITES = ("add_attempt", "update_attempt", "update_run", "set_meta", "add_checkpoints")
SCHEDULER_ACTS = ("submit", "submit_array", "cancel", "requeue")
FENCE_WRITERS = (tracker, same_job_attempts)  # every module of the controller that writes a fence
FENCE_WRITES = ("write_fence", "write_fence_unless_ahead", "fence_unless_moved_on")  # experiments.runtime.fence


@dataclass
class Crossings:
    """Counts the controller's side effects; raises ControllerCrash right after the ``crash_at``-th."""

    crash_at: int | None = None
    seen: list[str] = field(default_factory=list)

    def crossed(self, seam: str) -> None:
        self.seen.append(seam)
        if len(self.seen) == self.crash_at:
            raise ControllerCrash(f"killed right after crossing {len(self.seen)}: {seam}")

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


def _spec(tmp_path: Path, drill: Drill) -> Path:
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


def _world(spec: Path, drill: Drill, **options: Any) -> SimulatedCluster:
    runs = sorted(run.run_id for run in expand_runs(load_campaign(spec)))
    return SimulatedCluster(failures={(runs[index], attempt): failure
                                      for (index, attempt), failure in drill.failures.items()}, **options)


def _install(monkeypatch: pytest.MonkeyPatch, crossings: Crossings, world: SimulatedCluster) -> None:
    for name in LEDGER_WRITES:
        monkeypatch.setattr(Ledger, name, crossings.after(f"ledger.{name}", getattr(Ledger, name)))
    for module in FENCE_WRITERS:
        for name in FENCE_WRITES:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, crossings.after("fence", getattr(module, name)))
    for name in SCHEDULER_ACTS:
        monkeypatch.setattr(world, name, crossings.after(f"scheduler.{name}", getattr(world, name)))


def _drive(spec: Path, world: SimulatedCluster) -> None:
    """One controller on the workdir until the drill ends (or a crossing kills it)."""
    controller = None
    try:
        controller = Controller(load_campaign(spec), backend=world)
        assert controller.run()
    finally:
        if controller is not None:
            controller.close()


def _outcome(spec: Path) -> dict[str, tuple[str, str | None, int | None, list[str | None]]]:
    """Run id -> (status, final digest, the attempt the final record names, each attempt's class)."""
    ledger = Ledger.in_workdir(load_campaign(spec).workdir)
    try:
        return {row.run_id: (row.status, row.final_digest, _final_attempt(spec, row.run_id),
                             [attempt.failure_class for attempt in ledger.attempts(row.run_id)])
                for row in ledger.runs()}
    finally:
        ledger.close()


def _final_attempt(spec: Path, run_id: str) -> int | None:
    final = load_campaign(spec).workdir / "runs" / run_id / "final.json"
    return json.loads(final.read_text())["attempt"] if final.exists() else None


def _check(world: SimulatedCluster, outcome: dict[str, Any], expected: dict[str, Any], where: str,
           backoff_s: float = 0.0) -> None:
    assert outcome == expected, where
    assert all(len(jobs) == 1 for jobs in world.ran.values()), f"an attempt ran two jobs: {world.ran} {where}"
    assert not world.alive(), f"left on the scheduler: {world.alive()} {where}"
    for (run_id, attempt), failed_at in world.failed_at.items():  # a policy backoff was waited out
        began = world.began.get((run_id, attempt + 1))
        assert began is None or began >= failed_at + backoff_s, f"{run_id} {attempt + 1} began early {where}"


@pytest.fixture
def workdirs(tmp_path: Path) -> Iterator[Path]:
    """Where the drills' workdirs go: a tmpfs if there is one (the ledger's and the fences' fsyncs,
    ~150 drills of them, cost nothing there), else tmp_path."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="faultdrill-crash-points-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(DRILLS))
def test_a_controller_killed_after_any_side_effect_is_followed_by_one_that_ends_the_drill_the_same(
        workdirs: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    tmp_path, drill = workdirs, DRILLS[name]
    spec = _spec(tmp_path / "clean", drill)
    world, crossings = _world(spec, drill), Crossings()
    with monkeypatch.context() as patch:
        _install(patch, crossings, world)
        _drive(spec, world)
    expected = _outcome(spec)
    backoff_s = min((entry.get("backoff_s", 0.0) for entry in drill.restart.get("policy", {}).values()), default=0.0)
    _check(world, expected, expected, "(no crash)", backoff_s)
    assert [status for status, *_ in expected.values()] == list(drill.statuses), expected
    assert sorted(str(classes) for *_, classes in expected.values()) == drill.classes, expected
    total = len(crossings.seen)
    assert total > 20, crossings.seen
    print(f"crash-point harness, {name}: {total} crossings ({', '.join(sorted(set(crossings.seen)))})")

    for crash_at in range(1, total + 1):
        spec = _spec(tmp_path / f"crash-{crash_at}", drill)
        world, crossings = _world(spec, drill), Crossings(crash_at=crash_at)
        where = f"(killed after crossing {crash_at} of {total})"
        with monkeypatch.context() as patch:
            _install(patch, crossings, world)
            try:
                _drive(spec, world)
            except ControllerCrash as crash:
                where = f"({crash}; crossings before it: {crossings.seen[-6:]})"
        world.tick()  # the cluster goes on while no controller is there: a pending job starts
        _drive(spec, world)  # the next controller, on the same workdir and the same scheduler
        _check(world, _outcome(spec), expected, where, backoff_s)


def test_the_harness_crosses_every_fence_write_of_the_controller() -> None:
    """A module of orchestrator/ that writes a fence and is missing from FENCE_WRITERS (or a fence
    writer missing from FENCE_WRITES) would write fences the harness never crashes after."""
    root = Path(__file__).resolve().parents[2]
    writers, writes = set(), set()
    for path in (root / "orchestrator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "experiments.runtime.fence":
                names = {alias.name for alias in node.names if "fence" in alias.name and alias.name != "read_fence"}
                if names - {"Fence"}:
                    writers.add(".".join(path.relative_to(root).with_suffix("").parts))
                    writes |= names - {"Fence"}
    assert writers == {module.__name__ for module in FENCE_WRITERS}
    assert writes <= set(FENCE_WRITES), writes



def _runs_in_flight(spec: Path, world: SimulatedCluster) -> None:
    """A controller drives the drill until every run it has submitted is running, then dies."""
    def observe(trackers: list[Any]) -> None:
        watched = [tracker.watch for tracker in trackers if tracker.watch is not None]
        if len(watched) == 2 and all(watch.job_started is not None for watch in watched):
            raise ControllerCrash("stopped with its runs in flight")

    controller = Controller(load_campaign(spec), backend=world)
    try:
        with pytest.raises(ControllerCrash):
            controller.run(observe)
    finally:
        controller.close()


def _cancel(spec: Path, world: SimulatedCluster) -> list[str]:
    """``faultdrill cancel`` on the workdir: the jobs still alive after it."""
    controller = Controller(load_campaign(spec), backend=world)
    try:
        return controller.cancel(confirm_timeout_s=1.0).alive
    finally:
        controller.close()


def _cancelled(spec: Path) -> tuple[dict[str, str], bool]:
    ledger = Ledger.in_workdir(load_campaign(spec).workdir)
    try:
        return {row.run_id: row.status for row in ledger.runs()}, ledger.meta("finished") is not None
    finally:
        ledger.close()


def test_a_cancel_killed_after_any_side_effect_is_finished_by_the_next(
        workdirs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``faultdrill cancel`` of a drill with two runs in flight and one waiting, killed after each of
    its side effects in turn, then run again: every run cancelled, the drill finished, no job left."""
    drill = Drill("resubmit", {}, [])
    spec = _spec(workdirs / "clean", drill)
    world, crossings = SimulatedCluster(polls_to_finish=10**6), Crossings()
    _runs_in_flight(spec, world)
    with monkeypatch.context() as patch:
        _install(patch, crossings, world)
        assert _cancel(spec, world) == []
    expected = _cancelled(spec)
    assert expected == ({run_id: "cancelled" for run_id in expected[0]}, True) and len(expected[0]) == 3, expected
    assert not world.alive()
    total = len(crossings.seen)
    print(f"crash-point harness, cancel: {total} crossings ({', '.join(sorted(set(crossings.seen)))})")

    for crash_at in range(1, total + 1):
        spec = _spec(workdirs / f"cancel-{crash_at}", drill)
        world, crossings = SimulatedCluster(polls_to_finish=10**6), Crossings(crash_at=crash_at)
        _runs_in_flight(spec, world)
        where = "(no crash)"
        with monkeypatch.context() as patch:
            _install(patch, crossings, world)
            try:
                _cancel(spec, world)
            except ControllerCrash as crash:
                where = f"({crash}; crossings before it: {crossings.seen[-6:]})"
        assert _cancel(spec, world) == [], where
        assert _cancelled(spec) == expected, where
        assert not world.alive(), f"left on the scheduler: {world.alive()} {where}"
