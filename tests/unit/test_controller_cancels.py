"""What the controller records of the jobs it cancels itself, against a scheduler that records every
call (tests/unit/fake_scheduler.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fake_scheduler import (
    ControllerCrash,
    FakeScheduler,
    launch_exited,
    rank_fell_silent,
    run_completed,
    when_first_job_runs,
)
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.states import JobState

pytestmark = pytest.mark.unit


def _spec(tmp_path: Path, strategy: str, max_restarts: int = 0, hang_timeout_s: float = 600.0,
          **restart: float) -> Path:
    spec = {
        "name": "gives-up", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"strategy": strategy, "max_restarts": max_restarts, "poll_interval_s": 0.01,
                    "hang_timeout_s": hang_timeout_s, **restart},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("strategy", ["in-allocation", "requeue"])
def test_the_drills_own_give_up_cancel_keeps_the_failures_class(tmp_path: Path, strategy: str) -> None:
    """Issue 21, item 7: the rank launch dies of SIGKILL (137), the policy gives up and the drill
    cancels the job the next attempt would have run in; the scheduler's CANCELLED that follows is
    the drill's doing, not "cancelled outside the drill": the attempt stays RANK_SIGNAL."""
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path, strategy)), backend=scheduler)
    [run] = controller.runs

    ranks_die_once_running = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))

    try:
        assert controller.run(observer=ranks_die_once_running)
        [attempt] = controller.ledger.attempts(run.run_id)
        status = controller.ledger.run(run.run_id).status
    finally:
        controller.close()
    assert scheduler.called("cancel") == [attempt.job_id]
    assert attempt.state == JobState.CANCELLED.value
    assert attempt.failure_class == "RANK_SIGNAL", (attempt.failure_class, attempt.class_evidence)
    assert status == "gave_up"


def test_a_controller_that_dies_right_after_cancelling_a_failed_job_restarts_the_run(tmp_path: Path) -> None:
    """Issue 21, item 2: a rank hangs; the drill cancels the job and dies before it records the
    failure. The next controller sees CANCELLED: the drill's own doing (journaled before the
    cancel), so the run restarts; no person cancelled it."""
    spec = load_campaign(_spec(tmp_path, "resubmit", max_restarts=2, hang_timeout_s=1.0))
    scheduler = FakeScheduler(crash_after={"cancel"})
    first = Controller(spec, backend=scheduler)
    [run] = first.runs

    rank_hangs_once_running = when_first_job_runs(scheduler, lambda job: rank_fell_silent(run.paths.root, 0, silent_s=30.0))

    with pytest.raises(ControllerCrash):
        first.run(observer=rank_hangs_once_running)
    first.close()

    second = Controller(spec, backend=scheduler)
    try:
        second.run(observer=lambda trackers, touched: len(scheduler.called("submit")) == 2 and second.stop_requested.set())
        attempts = second.ledger.attempts(run.run_id)
        status = second.ledger.run(run.run_id).status
    finally:
        second.close()
    assert status == "running" and [a.attempt for a in attempts] == [0, 1], (status, attempts)
    assert attempts[0].failure_class == "HANG", (attempts[0].failure_class, attempts[0].class_evidence)


def _in_flight(tmp_path: Path, scheduler: FakeScheduler) -> Path:
    """A drill stopped with its run's first job accepted (and running): the workdir's spec path."""
    path = _spec(tmp_path, "resubmit", max_restarts=2)
    controller = Controller(load_campaign(path), backend=scheduler)
    try:
        controller.run(observer=lambda trackers, touched: scheduler.called("submit") and controller.stop_requested.set())
    finally:
        controller.close()
    for job in scheduler.states:
        scheduler.states[job] = JobState.RUNNING
    return path


@pytest.mark.parametrize("unreachable", ["cancel", "poll"])
def test_a_cancel_the_scheduler_does_not_confirm_records_nothing_as_cancelled(tmp_path: Path,
                                                                              unreachable: str) -> None:
    """Issue 21, item 1: the scheduler refuses the cancel, or cannot say whether the job ended:
    the job is named as still alive, the run is not recorded cancelled, the drill not finished."""
    scheduler = FakeScheduler()
    spec = load_campaign(_in_flight(tmp_path, scheduler))
    [job] = list(scheduler.states)
    scheduler.refuse = {unreachable}
    controller = Controller(spec, backend=scheduler)
    try:
        outcome = controller.cancel(confirm_timeout_s=0.5)
        [run] = controller.runs
        status, finished = controller.ledger.run(run.run_id).status, controller.ledger.meta("finished")
        [attempt] = controller.ledger.attempts(run.run_id)
    finally:
        controller.close()
    assert outcome.alive == [job] and status == "running" and finished is None
    assert attempt.ended is None and attempt.failure_class is None


def test_a_cancel_the_scheduler_confirms_ends_the_run_and_the_drill(tmp_path: Path) -> None:
    scheduler = FakeScheduler()
    spec = load_campaign(_in_flight(tmp_path, scheduler))
    [job] = list(scheduler.states)
    controller = Controller(spec, backend=scheduler)
    try:
        outcome = controller.cancel(confirm_timeout_s=5.0)
        [run] = controller.runs
        status, finished = controller.ledger.run(run.run_id).status, controller.ledger.meta("finished")
    finally:
        controller.close()
    assert outcome.alive == [] and outcome.cancelled == {run.run_id: [job]}
    assert status == "cancelled" and finished is not None


def test_a_final_record_no_attempt_of_this_drill_wrote_does_not_complete_its_run(tmp_path: Path) -> None:
    """Issue 21, item 1: an orphan of an archived drill wrote final.json into the run directory the
    new drill reuses; the new drill submits its run instead of recording it completed with no
    attempt and no job."""
    from experiments.layout import FinalRecord, record_dict, write_json_atomic

    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path, "resubmit")), backend=scheduler)
    [run] = controller.runs
    run.paths.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run.paths.final, record_dict(FinalRecord(step=100, digest="orphan", time=0.0, attempt=0,
                                                               drill_id="an-earlier-drill")))
    try:
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
        status = controller.ledger.run(run.run_id).status
    finally:
        controller.close()
    assert scheduler.called("submit") == [(run.run_id, 0)] and status == "running"
    assert not run.paths.final.exists() and list(run.paths.root.glob("final.json.foreign-*")), "kept aside"


def test_ranks_that_hang_after_the_final_record_are_ended_and_the_run_stays_completed(tmp_path: Path) -> None:
    """Issue 21, item 5: rank 0 wrote the final record, then the ranks hang in their exit (a
    process group's teardown, MPI finalize): past finish_timeout_s the run is completed and the
    drill cancels the job, which held its nodes to its walltime before."""
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path, "resubmit", finish_timeout_s=0.5)), backend=scheduler)
    [run] = controller.runs

    ranks_finish_and_hang = when_first_job_runs(scheduler, lambda job: run_completed(run.paths.root, 0, steps=100))

    try:
        assert controller.run(observer=ranks_finish_and_hang)
        [attempt] = controller.ledger.attempts(run.run_id)
        status = controller.ledger.run(run.run_id).status
    finally:
        controller.close()
    assert status == "completed" and scheduler.called("cancel") == [attempt.job_id]
    assert attempt.state == JobState.CANCELLED.value and attempt.failure_class is None


def test_a_requeue_the_scheduler_refuses_ends_the_job_it_would_have_run_in(tmp_path: Path) -> None:
    """Issue 21, item 10: scontrol requeue refused past cancel_timeout_s: the run gives up and the
    job is cancelled (it held its nodes, its next attempt REQUEUING, the fence admitting it)."""
    scheduler = FakeScheduler(refuse={"requeue"})
    spec = load_campaign(_spec(tmp_path, "requeue", max_restarts=2, cancel_timeout_s=0.2))
    controller = Controller(spec, backend=scheduler)
    [run] = controller.runs

    ranks_die_once_running = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))

    try:
        assert controller.run(observer=ranks_die_once_running)
        attempts = controller.ledger.attempts(run.run_id)
        status = controller.ledger.run(run.run_id).status
    finally:
        controller.close()
    [job] = list(scheduler.states)
    assert status == "gave_up" and scheduler.called("cancel") == [job], scheduler.calls
    assert attempts[0].failure_class == "RANK_SIGNAL", attempts[0]
    assert all(row.ended is not None for row in attempts), attempts


def test_a_final_record_of_this_drill_from_an_attempt_the_ledger_has_not_seen_completes_the_run(
        tmp_path: Path) -> None:
    """Review of item 1: a warm job numbers its re-formed attempts itself; stopped while one ran on,
    the controller never recorded attempt 1, which completed. Its final record is this drill's: the
    next controller completes the run from it (it moved it aside as foreign before)."""
    from experiments.layout import FinalRecord, record_dict, write_json_atomic

    scheduler = FakeScheduler()
    spec = load_campaign(_spec(tmp_path, "resubmit"))
    first = Controller(spec, backend=scheduler)
    [run] = first.runs
    try:
        first.run(observer=lambda trackers, touched: scheduler.called("submit") and first.stop_requested.set())
        drill_id = first.drill_id
    finally:
        first.close()
    [job] = list(scheduler.states)
    scheduler.states[job] = JobState.COMPLETED
    write_json_atomic(run.paths.final, record_dict(FinalRecord(step=100, digest="warm", time=0.0, attempt=1,
                                                               drill_id=drill_id)))
    second = Controller(spec, backend=scheduler)
    try:
        assert second.run()
        row = second.ledger.run(run.run_id)
    finally:
        second.close()
    assert (row.status, row.final_digest) == ("completed", "warm") and run.paths.final.exists()


def test_a_cancel_after_a_refused_requeue_is_escalated_until_the_job_ends(tmp_path: Path) -> None:
    """Review of item 10: in a brownout the scheduler refuses the requeue and then the cancel too:
    the cancel is followed (tried again, forced) like every failed job's, not asked once."""
    scheduler = FakeScheduler(refuse={"requeue", "cancel"})
    spec = load_campaign(_spec(tmp_path, "requeue", max_restarts=2, cancel_timeout_s=0.2))
    controller = Controller(spec, backend=scheduler)
    [run] = controller.runs

    ranks_die_once_running = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))

    try:
        assert controller.run(observer=ranks_die_once_running)
    finally:
        controller.close()
    assert len(scheduler.called("cancel")) >= 2, scheduler.calls


def test_a_cancel_journaled_by_a_controller_that_died_before_it_is_carried_out_by_the_next(tmp_path: Path) -> None:
    """Review of item 2: the give-up's cancel is journaled (ended_by_drill), then the controller
    dies before it asks the scheduler. The next controller gives the run up again and cancels the
    job too (it kept training into a run recorded as given up)."""
    scheduler = FakeScheduler(crash_before={"cancel"})
    spec = load_campaign(_spec(tmp_path, "in-allocation"))
    first = Controller(spec, backend=scheduler)
    [run] = first.runs

    ranks_die_once_running = when_first_job_runs(scheduler, lambda job: launch_exited(run.paths.root, 0, 137))

    with pytest.raises(ControllerCrash):
        first.run(observer=ranks_die_once_running)
    first.close()
    [job] = list(scheduler.states)
    assert scheduler.states[job] is JobState.RUNNING and not scheduler.called("cancel")
    second = Controller(spec, backend=scheduler)
    try:
        assert second.run()
        status = second.ledger.run(run.run_id).status
        [attempt] = second.ledger.attempts(run.run_id)
    finally:
        second.close()
    assert scheduler.called("cancel") == [job] and scheduler.states[job] is JobState.CANCELLED
    assert status == "gave_up" and attempt.failure_class == "RANK_SIGNAL", (status, attempt)


def test_a_finish_that_lingers_is_polled_at_the_regular_pace(tmp_path: Path) -> None:
    """Review of item 5: after rank 0's final record the job's end is news (polled early, at most
    once a second); ranks that hang in their exit kept squeue polled once a second until
    finish_timeout_s. A few seconds on, the regular pace."""
    import time as clock

    from orchestrator.observe.watch import AttemptWatch

    controller = Controller(load_campaign(_spec(tmp_path, "resubmit")), backend=FakeScheduler())
    pools = controller.injector_pools()
    try:
        [tracker] = controller.trackers(pools)
        tracker.status = "running"
        tracker.watch = watch = AttemptWatch(attempt=0, job_id="1", paths=tracker.run.paths, ranks=1)
        watch.state, watch.completed = JobState.RUNNING, True
        assert tracker.awaits_scheduler, "the job's end is news right after the final record"
        watch.completed_seen_at = clock.time() - 60.0
        assert not tracker.awaits_scheduler, "a minute on, a hung exit is polled at the regular pace"
    finally:
        for pool in pools.values():
            pool.shutdown()
        controller.close()


def test_a_policy_backoff_outlives_the_controller(tmp_path: Path) -> None:
    """Issue 21, item 10: the policy's backoff before the next submission was kept in memory: a
    controller stopped during it was followed by one that submitted at once."""
    path = _spec(tmp_path, "resubmit", max_restarts=2)
    data = yaml.safe_load(path.read_text())
    data["restart"]["policy"] = {"RANK_SIGNAL": {"backoff_s": 30}}
    path.write_text(yaml.safe_dump(data))
    spec = load_campaign(path)
    scheduler = FakeScheduler()
    first = Controller(spec, backend=scheduler)
    [run] = first.runs

    def ranks_die(job: str) -> None:
        launch_exited(run.paths.root, 0, 137)
        scheduler.states[job] = JobState.FAILED

    start = when_first_job_runs(scheduler, ranks_die)

    def ranks_die_then_stop(trackers: list, touched: list) -> None:
        start(trackers, touched)
        if len(first.ledger.attempts(run.run_id)) == 2:
            first.stop_requested.set()  # stopped during the backoff

    try:
        first.run(observer=ranks_die_then_stop)
    finally:
        first.close()
    second = Controller(spec, backend=scheduler)
    rounds: list[int] = []

    def twenty_rounds(trackers: list, touched: list) -> None:
        rounds.append(1)
        if len(rounds) >= 20:
            second.stop_requested.set()

    try:
        second.run(observer=twenty_rounds)
    finally:
        second.close()
    assert scheduler.called("submit") == [(run.run_id, 0)], "attempt 1 went out before its backoff ended"


def test_a_thread_journaled_cancel_of_an_earlier_attempts_job_is_carried_out_by_the_next_controller(
        tmp_path: Path) -> None:
    """Review of item 2: in-allocation, attempt 0's hung launch could not be ended alone; the kill
    thread journaled the cancel of job 4242, where attempt 1 already runs, and its controller died
    before the scancel. The next controller skipped 4242 as in flight: it is cancelled now."""
    import json
    import time
    from dataclasses import asdict

    from orchestrator.campaign.failure_classes import DrillEnded

    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path, "in-allocation", max_restarts=2)), backend=scheduler)
    run = controller.runs[0]
    ledger = controller.ledger
    ledger.add_attempt(run.run_id, 0)
    ledger.update_attempt(run.run_id, 0, job_id="4242", state="STEP_FAILED", ended=time.time(), reason="hang",
                          ended_by_drill=json.dumps(asdict(DrillEnded("HANG", "its hung launch could not be ended"))))
    ledger.add_attempt(run.run_id, 1)
    ledger.update_attempt(run.run_id, 1, job_id="4242", state="RUNNING")
    scheduler.states["4242"] = JobState.RUNNING
    pools = controller.injector_pools()
    try:
        [tracker] = controller.trackers(pools)
        tracker.reclaim_cancels(time.time())
        assert scheduler.called("cancel") == ["4242"] and 0 in tracker.closing.jobs
    finally:
        for pool in pools.values():
            pool.shutdown()
        controller.close()
