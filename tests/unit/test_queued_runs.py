"""Runs whose job waits in the scheduler's queue, out of the controller's rounds (issue 29,
orchestrator/control/scheduler_queue.py), against a scheduler that records every call: what a
review of the change found (helper 54), each seen failing first. Detection is counted in the
controller's rounds, against a regular poll many rounds away (no time is asserted)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from experiments.runtime.fence import read_fence
from fake_scheduler import ControllerCrash, FakeScheduler, launch_exited
from orchestrator.backends.base import Submission
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.states import JobState

pytestmark = pytest.mark.unit

DEADLINE_S = 20.0  # a drill that never sees what it waits for stops here (and fails its assertion)
FEW_ROUNDS = 5  # detected within this many rounds: not at the regular poll (80 rounds away and more)


def _sweep(tmp_path: Path, runs: int, parallel_runs: int, **restart: Any) -> Path:
    spec = {
        "name": "array-sweep", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"max_restarts": 1, "poll_interval_s": 0.01, **restart},
        "parallel_runs": parallel_runs, "submit_as_array": True,
        "sweep": {"grid": {"workload.seed": list(range(runs))}},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class RunningArrays(FakeScheduler):
    """Every array element runs as soon as it is submitted (the poll says RUNNING)."""

    def submit_array(self, items: list[Any], throttle: int | None = None) -> list[Submission]:
        submitted = super().submit_array(items, throttle)
        self.states.update(dict.fromkeys([submission.job_id for submission in submitted], JobState.RUNNING))
        return submitted


def test_a_first_element_that_starts_and_fails_in_one_read_is_driven_once_a_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The array's first pending element is seen started and failed in one look (its launch exited
    137) before the poll says RUNNING: it is resubmitted as a new job, and no round drives the run
    twice (its entry under the old element stayed in the queue and took it back every round)."""
    from orchestrator.control.tracker import RunTracker

    advanced: list[str] = []
    advance = RunTracker.advance
    monkeypatch.setattr(RunTracker, "advance",
                        lambda self, *args, **kwargs: advanced.append(self.run.run_id) or advance(self, *args, **kwargs))
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_sweep(tmp_path, runs=3, parallel_runs=1)), backend=scheduler)
    rounds: list[list[str]] = []
    failed_job: list[str] = []

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        rounds.append(list(advanced))
        advanced.clear()
        if len(rounds) == 1:
            first = next(t for t in trackers if t.job_id and t.job_id.endswith("_0"))
            launch_exited(first.run.paths.root, 0, 137)  # started and failed between two looks; the poll says PENDING
            failed_job.append(first.job_id)
        if len(rounds) == 4:
            scheduler.states[failed_job[0]] = JobState.FAILED
        if len(rounds) == 10:
            controller.stop_requested.set()

    try:
        controller.run(observer=observe)
    finally:
        controller.close()
    assert len(scheduler.called("submit")) == 1, "the failed element's run went out again as a job of its own"
    assert all(len(set(runs)) == len(runs) for runs in rounds), rounds


def _run_rounds(controller: Controller, each_round: Callable[[list[Any], int], bool]) -> None:
    """The controller's loop, ``each_round(trackers, its number)`` after every round until it says
    it has what it waits for (or the deadline passes)."""
    rounds = [0]
    deadline = time.monotonic() + DEADLINE_S

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        rounds[0] += 1
        if each_round(trackers, rounds[0]) or time.monotonic() > deadline:
            controller.stop_requested.set()

    try:
        controller.run(observer=observe)
    finally:
        controller.close()


def _all_running(controller: Controller, trackers: list[Any]) -> bool:
    """The poll answered and every run's job was seen running."""
    return controller.poller.stats.calls >= 1 and all(t.watch and t.watch.running_since for t in trackers)


def _kill_every_launch_once_running(controller: Controller, trackers: list[Any]) -> bool:
    """Every run's first launch exits by SIGKILL once all of them run; whether that happened."""
    if not _all_running(controller, trackers):
        return False
    for tracker in trackers:
        launch_exited(tracker.run.paths.root, 0, 137)
    return True


def _detected_in_rounds(controller: Controller, failed: list[tuple[str, int]], rounds_at_failure: int,
                        rounds: int, seen: dict[str, int]) -> None:
    for run_id, attempt in failed:
        rows = controller.ledger.attempts(run_id)
        if run_id not in seen and len(rows) > attempt and rows[attempt].detected is not None:
            seen[run_id] = rounds - rounds_at_failure


def test_elements_that_start_together_are_seen_in_the_same_round(tmp_path: Path) -> None:
    """Two elements of one array (throttle 2) start together and fail at once, before the next
    poll: both failures are detected within a few rounds (the second waited for the regular poll)."""
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_sweep(tmp_path, runs=2, parallel_runs=2, scheduler_poll_s=600.0,
                                                 poll_interval_s=0.05)), backend=scheduler)
    failed_in: list[int] = []
    seen: dict[str, int] = {}

    def each_round(trackers: list[Any], round_: int) -> bool:
        if not failed_in and controller.poller.stats.calls >= 1:  # the first poll answered: PENDING
            for tracker in trackers:
                launch_exited(tracker.run.paths.root, 0, 137)
            failed_in.append(round_)
        elif failed_in:
            _detected_in_rounds(controller, [(t.run.run_id, 0) for t in trackers], failed_in[0], round_, seen)
        return len(seen) == 2

    _run_rounds(controller, each_round)
    assert len(seen) == 2 and max(seen.values()) <= FEW_ROUNDS, seen


def test_an_attempt_relaunched_in_its_running_job_is_not_taken_for_a_queued_one(tmp_path: Path) -> None:
    """in-allocation: 8 runs of one array, all running; their launches fail together and each
    relaunches in its job, whose new watch has heard nothing yet: it is not parked as a job waiting
    in the queue (the poll never said PENDING), and the relaunches' own failures are detected
    within a few rounds."""
    scheduler = RunningArrays()
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=8, strategy="in-allocation",
                                                 scheduler_poll_s=600.0, poll_interval_s=0.05)), backend=scheduler)
    phase: list[int] = []
    seen: dict[str, int] = {}

    def each_round(trackers: list[Any], round_: int) -> bool:
        if not phase:
            if _kill_every_launch_once_running(controller, trackers):
                phase.append(0)
        elif len(phase) == 1 and all(t.watch and t.watch.attempt == 1 for t in trackers):
            for tracker in trackers:
                launch_exited(tracker.run.paths.root, 1, 137)
            phase.append(round_)
        elif len(phase) == 2:
            _detected_in_rounds(controller, [(t.run.run_id, 1) for t in trackers], phase[1], round_, seen)
        return len(seen) == 8

    _run_rounds(controller, each_round)
    assert len(seen) == 8 and max(seen.values()) <= FEW_ROUNDS, seen


def test_an_in_allocation_go_held_for_its_backoff_is_given_after_it(tmp_path: Path) -> None:
    """in-allocation with a policy backoff: two running runs of one array fail together; each
    relaunch's go, held for the backoff, is given a few rounds later (the fence names attempt 1
    and the job), not at the regular poll."""
    scheduler = RunningArrays()
    controller = Controller(load_campaign(_sweep(tmp_path, runs=2, parallel_runs=2, strategy="in-allocation",
                                                 scheduler_poll_s=600.0, poll_interval_s=0.05,
                                                 policy={"RANK_SIGNAL": {"backoff_s": 0.05}})), backend=scheduler)
    failed_in: list[int] = []
    seen: dict[str, int] = {}

    def each_round(trackers: list[Any], round_: int) -> bool:
        if not failed_in:
            if _kill_every_launch_once_running(controller, trackers):
                failed_in.append(round_)
        else:
            for tracker in trackers:
                fence = read_fence(tracker.run.paths)
                if tracker.run.run_id not in seen and fence is not None and fence.attempt == 1 and fence.job_id:
                    seen[tracker.run.run_id] = round_ - failed_in[0]
        return len(seen) == 2

    _run_rounds(controller, each_round)
    # the backoff is 0.05 s, a round 0.05 s: the go comes within a few rounds of it
    assert len(seen) == 2 and max(seen.values()) <= 2 * FEW_ROUNDS, seen


def test_every_job_goes_out_with_its_runs_fence_after_a_crash_at_the_arrays_first_fence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller dies as it writes the array's first fence, its attempts recorded: the next
    controller submits each run again, and every job goes out with its run's fence on disk."""
    from experiments.runtime import fence as fence_module

    seen: list[tuple[str, object]] = []

    class Fenced(FakeScheduler):
        def submit(self, run: Any, job: Any) -> Submission:
            seen.append((run.run_id, read_fence(run.paths)))
            return super().submit(run, job)

        def submit_array(self, items: list[Any], throttle: int | None = None) -> list[Submission]:
            seen.extend((run.run_id, read_fence(run.paths)) for run, _ in items)
            return super().submit_array(items, throttle)

    spec = load_campaign(_sweep(tmp_path, runs=3, parallel_runs=3))
    scheduler = Fenced()
    replace = fence_module._replace

    def dies(*args: object, **kwargs: object) -> None:
        raise ControllerCrash("killed as it writes the first fence")

    controller = Controller(spec, backend=scheduler)
    monkeypatch.setattr(fence_module, "_replace", dies)
    try:
        with pytest.raises(ControllerCrash):
            controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
    finally:
        monkeypatch.setattr(fence_module, "_replace", replace)
        controller.close()
    controller = Controller(spec, backend=scheduler)
    try:
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
    finally:
        controller.close()
    assert len(seen) == 3 and all(fence is not None for _, fence in seen), seen


def test_a_restarted_controller_adopts_a_sweeps_runs_with_one_sync_of_their_fences(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a controller restarted under a sweep of 10,000 runs wrote each adopted run's fence
    durably on its loop, two fsyncs each, one after another, before its first round. Their fences
    are made durable together; each names its run's job when the first round begins."""
    from experiments.runtime import fence as fence_module

    spec = load_campaign(_sweep(tmp_path, runs=40, parallel_runs=40))
    scheduler = RunningArrays()
    controller = Controller(spec, backend=scheduler)
    try:
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
    finally:
        controller.close()
    syncs: list[str] = []
    fsync, syncfs = fence_module.os.fsync, fence_module.sync_filesystem
    monkeypatch.setattr(fence_module.os, "fsync", lambda fd: syncs.append("fsync") or fsync(fd))
    import orchestrator.control.controller as controller_module
    monkeypatch.setattr(controller_module, "sync_filesystem", lambda path: syncs.append("syncfs") or syncfs(path))
    fences: dict[str, object] = {}
    controller = Controller(spec, backend=scheduler)

    def first_round(trackers: list[Any], touched: list[Any]) -> None:
        fences.update((tracker.run.run_id, read_fence(tracker.run.paths)) for tracker in trackers)
        controller.stop_requested.set()

    try:
        controller.run(observer=first_round)
    finally:
        controller.close()
    assert syncs == ["syncfs"], syncs
    # An earlier controller's job is read whatever the spec says now (a coordinator's events too).
    assert all(tracker.watch is not None and len(tracker.watch.events.tails) == 4 for tracker in controller._trackers)
    # The workdir is on this host's own filesystem (pytest's tmp_path): a file is opened once it grew.
    assert all(tracker.watch is not None and tracker.watch.stat_first for tracker in controller._trackers)
    jobs = {tracker.run.run_id: tracker.job_id for tracker in controller._trackers}
    assert len(fences) == 40 and all(getattr(fence, "job_id", None) == jobs[run] for run, fence in fences.items())
