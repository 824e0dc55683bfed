"""The crash-point harness (issue 21): a drill of several runs against a simulated cluster
(tests/simulated_cluster.py), its controller killed right after each side effect in turn —
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
``faultdrill cancel`` with runs in flight and one waiting, and warm (the job's coordinator
re-forms it as the next attempt and fences that itself). The SIGKILL mode against a real process
is tests/drill/test_crash_points_sigkill.py; the parts both use are tests/crash_harness.py."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from crash_harness import (
    DRILLS,
    FENCE_WRITERS,
    FENCE_WRITES,
    Crossings,
    Drill,
    backoff_of,
    check,
    crash_workdirs,
    drive,
    install,
    outcome,
    spec_file,
    world_for,
)
from fake_scheduler import ControllerCrash
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.record.ledger import Ledger
from simulated_cluster import SimulatedCluster

pytestmark = pytest.mark.unit

def _until_crash(monkeypatch: pytest.MonkeyPatch, crossings: Crossings, world: SimulatedCluster,
                 act: Callable[[Path, SimulatedCluster], Any], spec: Path, where: str) -> str:
    """``act(spec, world)`` with every seam crossed through ``crossings``; where it was killed (else ``where``)."""
    with monkeypatch.context() as patch:
        install(patch.setattr, crossings, world)
        try:
            act(spec, world)
        except ControllerCrash as crash:
            return f"({crash}; crossings before it: {crossings.seen[-6:]})"
    return where


@pytest.fixture
def workdirs(tmp_path: Path) -> Iterator[Path]:
    with crash_workdirs(tmp_path) as directory:
        yield directory


@pytest.mark.parametrize("name", sorted(DRILLS))
def test_a_controller_killed_after_any_side_effect_is_followed_by_one_that_ends_the_drill_the_same(
        workdirs: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    tmp_path, drill = workdirs, DRILLS[name]
    spec = spec_file(tmp_path / "clean", drill)
    world, crossings = world_for(spec, drill), Crossings()
    with monkeypatch.context() as patch:
        install(patch.setattr, crossings, world)
        drive(spec, world)
    expected = outcome(spec)
    backoff_s = backoff_of(drill)
    check(world, expected, expected, "(no crash)", backoff_s)
    assert [status for status, *_ in expected.values()] == list(drill.statuses), expected
    assert sorted(str(classes) for *_, classes in expected.values()) == drill.classes, expected
    total = len(crossings.seen)
    assert total > 20, crossings.seen
    print(f"crash-point harness, {name}: {total} crossings ({', '.join(sorted(set(crossings.seen)))})")

    for crash_at in range(1, total + 1):
        spec = spec_file(tmp_path / f"crash-{crash_at}", drill)
        world, crossings = world_for(spec, drill), Crossings(crash_at=crash_at)
        where = _until_crash(monkeypatch, crossings, world, drive, spec,
                             f"(killed after crossing {crash_at} of {total})")
        world.tick()  # the cluster goes on while no controller is there: a pending job starts
        drive(spec, world)  # the next controller, on the same workdir and the same scheduler
        check(world, outcome(spec), expected, where, backoff_s)


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
    def observe(trackers: list[Any], touched: list[Any]) -> None:
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
    spec = spec_file(workdirs / "clean", drill)
    world, crossings = SimulatedCluster(polls_to_finish=10**6), Crossings()
    _runs_in_flight(spec, world)
    with monkeypatch.context() as patch:
        install(patch.setattr, crossings, world)
        assert _cancel(spec, world) == []
    expected = _cancelled(spec)
    assert expected == ({run_id: "cancelled" for run_id in expected[0]}, True) and len(expected[0]) == 3, expected
    assert not world.alive()
    total = len(crossings.seen)
    print(f"crash-point harness, cancel: {total} crossings ({', '.join(sorted(set(crossings.seen)))})")

    for crash_at in range(1, total + 1):
        spec = spec_file(workdirs / f"cancel-{crash_at}", drill)
        world, crossings = SimulatedCluster(polls_to_finish=10**6), Crossings(crash_at=crash_at)
        _runs_in_flight(spec, world)
        where = _until_crash(monkeypatch, crossings, world, _cancel, spec, "(no crash)")
        assert _cancel(spec, world) == [], where
        assert _cancelled(spec) == expected, where
        assert not world.alive(), f"left on the scheduler: {world.alive()} {where}"
