"""Issue 21, item 10: the restart policy's backoff under the strategies that go on in the same job.
in-allocation holds the go (the fence naming the next attempt and the job) with the job watched;
requeue holds its request and drops it if a person cancels the job meanwhile; both are recorded
with the attempt (``not_before``), so a controller started during the backoff waits out the rest.
A backoff the batch script would not wait for (restart.relaunch_wait_s) takes a new job after it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from experiments.runtime.fence import Fence, read_fence
from fake_scheduler import FakeScheduler, launch_exited, when_first_job_runs
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import Campaign, load_campaign
from orchestrator.control.controller import Controller
from orchestrator.record.ledger import AttemptRow
from orchestrator.states import JobState

pytestmark = pytest.mark.unit

BACKOFF_S = 30.0


def _spec(tmp_path: Path, strategy: str, backoff_s: float = BACKOFF_S, **restart: Any) -> Path:
    spec = {
        "name": "same-job-backoff", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"strategy": strategy, "max_restarts": 2, "poll_interval_s": 0.01,
                    "policy": {"RANK_SIGNAL": {"backoff_s": backoff_s}}, **restart},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _rounds_after_the_failure(controller: Controller, run: RunConfig, scheduler: FakeScheduler, rounds: int,
                              then: Callable[[], None] = lambda: None) -> Callable[[list[Any], list[Any]], None]:
    """An observer: the first job's ranks die (SIGKILL) once it runs; ``rounds`` rounds after the
    next attempt is recorded, ``then`` happens, and after as many again the controller stops."""
    ranks_die = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))
    seen: list[int] = []

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        ranks_die(trackers, touched)
        if len(controller.ledger.attempts(run.run_id)) >= 2:
            seen.append(1)
            if len(seen) == rounds:
                then()
            if len(seen) >= 2 * rounds:
                controller.stop_requested.set()
    return observe


@dataclass(frozen=True)
class Drilled:
    """What one controller left, once it stopped: the run's attempts and status, the run, the drill."""

    attempts: list[AttemptRow]
    status: str
    run: RunConfig
    drill_id: str


def _drill(spec: Campaign, scheduler: FakeScheduler, rounds: int,
           then: Callable[[], None] = lambda: None) -> Drilled:
    """A controller on the spec's workdir, stopped ``rounds`` rounds after the failure's next
    attempt is recorded (see _rounds_after_the_failure)."""
    controller = Controller(spec, backend=scheduler)
    [run] = controller.runs
    try:
        controller.run(observer=_rounds_after_the_failure(controller, run, scheduler, rounds, then=then))
        return Drilled(controller.ledger.attempts(run.run_id), controller.ledger.run(run.run_id).status, run,
                       controller.drill_id)
    finally:
        controller.close()


@pytest.mark.parametrize("strategy", ["in-allocation", "requeue"])
def test_a_same_job_strategy_waits_out_the_backoff_across_a_controller_restart(tmp_path: Path, strategy: str) -> None:
    spec = load_campaign(_spec(tmp_path, strategy))
    scheduler = FakeScheduler()
    first = _drill(spec, scheduler, 10)
    [_, next_attempt] = first.attempts
    [_, still] = _drill(spec, scheduler, 10).attempts
    run = first.run
    [job] = list(scheduler.states)
    assert next_attempt.not_before is not None and next_attempt.not_before > next_attempt.submitted + BACKOFF_S - 5
    assert scheduler.called("requeue") == [] and scheduler.called("submit") == [(run.run_id, 0)]
    if strategy == "in-allocation":  # the job is watched as attempt 1's; its go waits (requeue names it, by design)
        assert still.job_id == job and read_fence(run.paths) == Fence(1, None, first.drill_id)


@pytest.mark.parametrize("strategy", ["in-allocation", "requeue"])
def test_the_go_or_the_requeue_comes_once_the_backoff_has_passed(tmp_path: Path, strategy: str) -> None:
    spec = load_campaign(_spec(tmp_path, strategy, backoff_s=0.3))
    scheduler = FakeScheduler()
    drilled = _drill(spec, scheduler, 60)
    run, [failed, attempt] = drilled.run, drilled.attempts
    [job] = list(scheduler.states)
    assert read_fence(run.paths) == Fence(1, job, drilled.drill_id)
    assert attempt.accepted is not None and failed.ended is not None and attempt.accepted >= failed.ended + 0.3
    assert scheduler.called("requeue") == ([job] if strategy == "requeue" else [])


def test_a_person_cancelling_the_job_during_a_held_requeue_is_not_undone(tmp_path: Path) -> None:
    """The request would bring back the job its owner cancelled: dropped, the attempt CANCELLED, the
    run given up (the policy's default for CANCELLED)."""
    spec = load_campaign(_spec(tmp_path, "requeue", scheduler_poll_s=0.05))
    scheduler = FakeScheduler()

    def person_cancels() -> None:
        [job] = list(scheduler.states)
        scheduler.states[job] = JobState.CANCELLED

    drilled = _drill(spec, scheduler, 20, then=person_cancels)
    [_, attempt], status = drilled.attempts, drilled.status
    assert scheduler.called("requeue") == []
    assert (status, attempt.failure_class, attempt.state) == ("gave_up", "CANCELLED", "CANCELLED"), attempt


def test_a_backoff_the_batch_script_would_not_wait_for_takes_a_new_job_after_it(tmp_path: Path) -> None:
    spec = load_campaign(_spec(tmp_path, "in-allocation", backoff_s=0.3, relaunch_wait_s=5))
    scheduler = FakeScheduler()
    drilled = _drill(spec, scheduler, 60)
    run, [failed, attempt] = drilled.run, drilled.attempts
    first_job = failed.job_id
    assert scheduler.called("cancel") == [first_job] and failed.failure_class == "RANK_SIGNAL"
    assert scheduler.called("submit") == [(run.run_id, 0), (run.run_id, 1)] and attempt.job_id != first_job
    assert attempt.submitted is not None and failed.ended is not None and attempt.not_before is not None
    assert attempt.not_before >= failed.ended + 0.3


def test_a_job_that_ends_during_a_held_go_takes_the_go_with_it(tmp_path: Path) -> None:
    """Review: the held go outlived its attempt. The job waiting for attempt 1's go reached its
    walltime during the backoff; attempt 2 went out in a new job, and then the old go was given:
    the fence named attempt 1 of the dead job while attempt 2 ran. The fence never moves back."""
    spec = load_campaign(_spec(tmp_path, "in-allocation", backoff_s=1.0, scheduler_poll_s=0.02, max_restarts=3))
    scheduler = FakeScheduler()
    controller = Controller(spec, backend=scheduler)
    [run] = controller.runs
    fences: list[Fence | None] = []

    def walltime_during_the_hold() -> None:
        [job] = list(scheduler.states)
        scheduler.states[job] = JobState.TIMEOUT

    ranks_die = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))
    deadline = time.monotonic() + 30

    def watch_the_fence(trackers: list[Any], touched: list[Any]) -> None:
        ranks_die(trackers, touched)
        attempts = controller.ledger.attempts(run.run_id)
        if len(attempts) == 2 and attempts[1].failure_class is None and scheduler.states[attempts[0].job_id] \
                is JobState.RUNNING:
            walltime_during_the_hold()
        fences.append(read_fence(run.paths))
        held_go_due = attempts[1].not_before if len(attempts) >= 2 and attempts[1].not_before else float("inf")
        if (len(attempts) >= 3 and time.time() > held_go_due + 0.5) or time.monotonic() > deadline:
            controller.stop_requested.set()

    try:
        controller.run(observer=watch_the_fence)
        attempts = controller.ledger.attempts(run.run_id)
    finally:
        controller.close()
    assert len(attempts) == 3 and attempts[1].failure_class == "TIMEOUT", attempts
    named = [fence.attempt for fence in fences if fence is not None]
    assert named == sorted(named) and named[-1] == 2, f"the fence moved back: {named}"


def test_no_start_clock_runs_while_the_go_is_held(tmp_path: Path) -> None:
    """Review: the job is RUNNING while it waits for the go; the start clock ran from then, and a
    backoff longer than start_timeout_s failed the attempt START_TIMEOUT before its go. (Here no
    rank ever trains: a stuck start after the go is right.)"""
    spec = load_campaign(_spec(tmp_path, "in-allocation", backoff_s=1.5, start_timeout_s=0.5))
    held = _drill(spec, FakeScheduler(), 150).attempts[1]
    assert held.not_before is not None
    assert held.failure_class != "START_TIMEOUT" or (held.ended or 0) >= held.not_before + 0.45, held


def test_a_person_cancelling_a_held_requeues_job_while_no_controller_runs_is_not_undone(tmp_path: Path) -> None:
    """Review: a controller started after the cancel took the job's CANCELLED for the state it held
    at the failure, and requeued it once the backoff ended. The state at the failure is the
    failure's own record."""
    spec = load_campaign(_spec(tmp_path, "requeue", backoff_s=0.5, scheduler_poll_s=0.05))
    scheduler = FakeScheduler()
    _drill(spec, scheduler, 5)
    [job] = list(scheduler.states)
    scheduler.states[job] = JobState.CANCELLED  # its owner, while no controller ran
    drilled = _drill(spec, scheduler, 150)
    [_, attempt], status = drilled.attempts, drilled.status
    assert scheduler.called("requeue") == []
    assert (status, attempt.failure_class) == ("gave_up", "CANCELLED"), attempt
