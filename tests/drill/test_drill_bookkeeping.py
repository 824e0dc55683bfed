"""The controller's bookkeeping under the faults a review found (issue 7, items 2, 3, 6, 7, 10, 11,
13, 17), on the local backend: real rank processes, a real ledger, the real CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import cloudpickle
import psutil
import pytest
from recovery_checks import assert_phases_follow_the_moments

from drills import api_workload, drill, drill_processes, kill_verified, ledger_sql, run_of, write_spec
from experiments.layout import RankJob, RunPaths, attempt_event_lines, read_json_lines
from orchestrator.backends.base import Submission
from orchestrator.backends.local.backend import EnvLocalExecutor, LocalBackend, LocalJobRecord
from orchestrator.campaign.capabilities import Capability
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import load_campaign
from orchestrator.commands import CommandError
from orchestrator.control.controller import Controller
from orchestrator.control.tracker import RunTracker
from orchestrator.observe.scheduler_poll import SchedulerUnavailable
from orchestrator.record.ledger import Ledger
from orchestrator.states import JobState
from rank_launch import wait_for

# --- item 2: no double submission after a controller restart ------------------------------------


def test_a_job_started_but_never_recorded_is_adopted_not_submitted_again(tmp_path: Path) -> None:
    """The window between the process start and ``accept``: reproduced by doing what the controller
    does up to it (record the attempt, start the job) and stopping there."""
    spec = write_spec(tmp_path, workload=api_workload(300))
    controller = Controller(load_campaign(spec))
    run = controller.runs[0]
    with ThreadPoolExecutor(1) as pool:
        tracker = RunTracker(run, [], controller.backend, controller.ledger, pool, controller.drill_id)
        orphan = controller.backend.submit(run, tracker.begin_attempt(0))
    controller.close()
    report = drill(spec)
    attempts = run_of(report, "r000")["attempts"]
    assert [a["job_id"] for a in attempts] == [orphan.job_id], "the restarted controller submitted again"
    assert run_of(report, "r000")["status"] == "completed"


def test_a_stop_between_attempt_ended_and_run_completed_submits_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    first = drill(spec)
    assert len(run_of(first, "r000")["attempts"]) == 1
    # What a stop between the two writes left with separate statements: the attempt ended, the run
    # still "running", the drill not finished.
    ledger_sql(tmp_path / "work", "UPDATE runs SET status = 'running', ended = NULL, final_step = 0")
    ledger_sql(tmp_path / "work", "DELETE FROM meta WHERE key = 'finished'")
    again = drill(spec)
    run = run_of(again, "r000")
    assert len(run["attempts"]) == 1, "a finished run was submitted again"
    assert run["status"] == "completed" and run["final_step"] == 160


def test_a_restarted_controller_respects_the_restart_budget(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, restart={"max_restarts": 0, "poll_interval_s": 0.05},
                      faults=[{"kind": "kill-rank", "after": {"fixed": 0.2}, "anchor": "first_checkpoint", "rank": 1}])
    first = drill(spec, expect=1)
    assert run_of(first, "r000")["status"] == "gave_up"
    ledger_sql(tmp_path / "work", "UPDATE runs SET status = 'running', ended = NULL")
    ledger_sql(tmp_path / "work", "DELETE FROM meta WHERE key = 'finished'")
    again = drill(spec, expect=1)
    assert run_of(again, "r000")["status"] == "gave_up"
    assert len(run_of(again, "r000")["attempts"]) == 1, "the budget (max_restarts 0) was ignored"


def test_ledger_writes_are_durable_and_transactions_all_or_nothing(tmp_path: Path) -> None:
    ledger = Ledger.in_workdir(tmp_path)
    assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    ledger.set_meta("a", 1)
    with pytest.raises(RuntimeError):
        with ledger.transaction():
            ledger.set_meta("a", 2)
            ledger.set_meta("b", 3)
            raise RuntimeError("the controller is stopped here")
    assert (ledger.meta("a"), ledger.meta("b")) == (1, None)
    ledger.close()


# --- item 3: a failed submission is that run's problem -------------------------------------------


class FlakySubmitBackend(LocalBackend):
    """The local backend, with submissions that fail for some runs; ``accepted_anyway``: the job
    is started, then the command "fails" (as an sbatch that timed out after slurmctld took it)."""

    def __init__(self, drill_id: str, always_fail: set[str], accepted_anyway: set[str]) -> None:
        super().__init__(drill_id)
        self.always_fail, self.accepted_anyway = always_fail, accepted_anyway
        self.submitted: list[str] = []

    def submit(self, run: RunConfig, job: RankJob) -> Any:
        if run.run_id in self.always_fail:
            raise CommandError(["sbatch"], 1, "", "sbatch: error: invalid partition", "command failed")
        submission = super().submit(run, job)
        self.submitted.append(submission.job_id)
        if run.run_id in self.accepted_anyway:
            self.accepted_anyway.discard(run.run_id)
            raise CommandError(["sbatch"], None, "", "", "command timed out after 60 s")
        return submission


def test_a_failed_submission_is_retried_or_found_and_other_runs_go_on(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, sweep={"grid": {"workload.seed": [1, 2, 3]}}, parallel_runs=3,
                      restart={"max_restarts": 1, "poll_interval_s": 0.05, "submit_retries": 2,
                               "submit_backoff_s": 0.1})
    campaign = load_campaign(spec)
    controller = Controller(campaign)
    backend = FlakySubmitBackend(controller.drill_id, always_fail={"r001-seed=2"}, accepted_anyway={"r002-seed=3"})
    controller.backend = backend
    try:
        controller.run()
    finally:
        controller.close()
    ledger = Ledger.in_workdir(campaign.workdir)
    status = {run.run_id: run.status for run in ledger.runs()}
    assert status == {"r000-seed=1": "completed", "r001-seed=2": "gave_up", "r002-seed=3": "completed"}
    failed = ledger.attempts("r001-seed=2")
    assert [a.state for a in failed] == ["SUBMIT_FAILED", "SUBMIT_FAILED"]
    assert all("submission failed 3 times: " in (a.reason or "") and "invalid partition" in (a.reason or "")
               for a in failed)
    found = ledger.attempts("r002-seed=3")
    assert len(found) == 1 and found[0].job_id in backend.submitted
    assert len(backend.submitted) == 2, "the job accepted despite the error was submitted again"
    ledger.close()


# --- item 6: faults land in healthy attempts and are credited to what they caused ---------------


def test_every_planned_fault_is_accounted_for_and_credited_to_the_failure_it_caused(tmp_path: Path) -> None:
    faults = [{"kind": "kill-rank", "after": {"fixed": 0.0}, "anchor": "first_checkpoint", "rank": 1}] * 3
    faults.append({"kind": "kill-rank", "after": {"fixed": 3600.0}, "anchor": "training_start", "rank": 0})
    spec = write_spec(tmp_path, faults=faults, restart={"max_restarts": 5, "poll_interval_s": 0.05},
                      workload=api_workload(400))
    report = drill(spec, timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed"
    outcomes = [fault["outcome"] for fault in run["faults"]]
    assert "sending" not in outcomes and len(outcomes) == 4
    injected = [fault for fault in run["faults"] if fault["outcome"] == "injected"]
    assert len(injected) == 3, run["faults"]
    assert [fault["attempt"] for fault in injected] == [0, 1, 2], "faults landed in an attempt already failing"
    assert all(fault["detail"].startswith(f"caused: attempt {fault['attempt']} failed") for fault in injected)
    assert run["faults"][3]["outcome"] == "not fired" and "completed before" in run["faults"][3]["detail"]
    assert len(run["attempts"]) == 4
    assert [rec["fault_kind"] for rec in run["recoveries"]] == ["kill-rank"] * 3
    for recovery in run["recoveries"]:
        assert_phases_follow_the_moments(run, recovery, tmp_path / "work" / "runs" / "r000")
    for rec in run["recoveries"]:
        assert rec["failure_evidence"] == "fault" and rec["detect_s"] >= 0
    # attempts[].started is when the job really started (its rank 0's first line here), not acceptance.
    paths = RunPaths(tmp_path / "work" / "runs" / "r000")
    for number, attempt in enumerate(run["attempts"]):
        start = next(e for e in attempt_event_lines(paths, number) if e["event"] == "process_start")
        assert attempt["started"] == pytest.approx(start["time"]) and attempt["started"] >= attempt["accepted"]


def test_determinism_is_reported_only_for_runs_that_resumed(tmp_path: Path) -> None:
    never = [{"kind": "kill-rank", "after": {"fixed": 3600.0}, "anchor": "training_start", "rank": 1}]
    report = drill(write_spec(tmp_path, faults=never, baseline=True, parallel_runs=2))
    run = run_of(report, "r000")
    assert run["identical_to_baseline"] is True and not run["resumed"]
    assert run["faults"][0]["outcome"] == "not fired"
    assert report["study"]["determinism"] == []


# --- item 7: a natural failure is timed from its best evidence ----------------------------------


def test_a_natural_hang_is_timed_from_the_last_heartbeat(tmp_path: Path) -> None:
    hang_timeout = 2.0
    spec = write_spec(tmp_path, restart={"max_restarts": 2, "poll_interval_s": 0.05, "hang_timeout_s": hang_timeout,
                                         "checkpoint_timeout_s": 5.0},
                      workload=api_workload(600))
    paths = RunPaths(tmp_path / "work" / "runs" / "r000")
    stopped: list[int] = []

    def stop_a_rank() -> None:
        """Not the injector: the drill sees a hang it did not cause (a natural failure)."""
        wait_for(lambda: read_json_lines(paths.checkpoint_log), 120, "the first checkpoint")
        identity = json.loads(paths.rank_file(0, 1).read_text())
        [victim] = [p for p in drill_processes(paths.root, attempt=0) if p.pid == identity["pid"]]
        victim.send_signal(signal.SIGSTOP)
        stopped.append(victim.pid)

    stopper = threading.Thread(target=stop_a_rank)
    stopper.start()
    try:
        report = drill(spec)
    finally:
        stopper.join()
        kill_verified([p for p in drill_processes(paths.root) if p.pid in stopped])
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["attempts"][0]["reason"].startswith("hang: no heartbeat")
    [recovery] = run["recoveries"]
    assert recovery["fault_kind"] == "natural (hang)" and recovery["failure_evidence"] == "last_heartbeat"
    assert recovery["detect_s"] >= hang_timeout, "a hang's detection is its silence, not 0"
    assert_phases_follow_the_moments(run, recovery, paths.root)


# --- item 10: a scheduler that stops answering, a job that does not end ---------------------------


class MuteSchedulerBackend(LocalBackend):
    """Answers no poll once a job was submitted (a controller host cut off from slurmctld)."""

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        if job_ids:
            raise CommandError(["squeue"], 1, "", "slurm_load_jobs error: Unable to contact slurm controller",
                               "command failed")
        return {}


def test_a_scheduler_that_stops_answering_ends_the_drill_with_a_clear_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, restart={"poll_interval_s": 0.05, "scheduler_timeout_s": 1.0})
    campaign = load_campaign(spec)
    controller = Controller(campaign)
    controller.backend = MuteSchedulerBackend(controller.drill_id)
    started = time.monotonic()
    try:
        with pytest.raises(SchedulerUnavailable, match=r"has not answered for .*scheduler_timeout_s = 1\)"):
            controller.run()
        assert time.monotonic() - started < 60
        [attempt] = controller.ledger.attempts("r000")
        assert attempt.ended is None and attempt.job_id, "the drill must leave its job for a rerun to adopt"
        controller.backend.cancel(attempt.job_id, force=True)
    finally:
        controller.close()


class NeverEndingCancelBackend(LocalBackend):
    """Reports a cancelled job as still RUNNING, whatever happens to it (an unkillable job)."""

    def __init__(self, drill_id: str) -> None:
        super().__init__(drill_id)
        self.stuck: str | None = None
        self.cancels: list[tuple[str, bool]] = []

    def cancel(self, job_id: str, force: bool = False) -> None:
        self.cancels.append((job_id, force))
        self.stuck = self.stuck or job_id
        super().cancel(job_id, force)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        states = super().poll(job_ids)
        return {job_id: JobState.RUNNING if job_id == self.stuck else state for job_id, state in states.items()}


def test_a_cancelled_job_that_never_ends_is_killed_then_left_behind_and_the_drill_ends(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, faults=[{"kind": "kill-rank", "after": {"fixed": 0.1}, "anchor": "first_checkpoint",
                                         "rank": 1, "signal": "SIGSTOP"}],
                      restart={"poll_interval_s": 0.05, "hang_timeout_s": 1.5, "cancel_timeout_s": 0.5,
                               "checkpoint_timeout_s": 5.0},
                      workload=api_workload(600))
    campaign = load_campaign(spec)
    backends: list[NeverEndingCancelBackend] = []
    finished = threading.Event()

    def run_drill() -> None:  # a thread of its own, so that a drill that never ends fails the test
        controller = Controller(campaign)
        backends.append(NeverEndingCancelBackend(controller.drill_id))
        controller.backend = backends[0]
        try:
            controller.run()
            finished.set()
        finally:
            controller.close()

    runner = threading.Thread(target=run_drill, daemon=True)
    runner.start()
    runner.join(timeout=240)
    assert finished.is_set(), "the drill waited forever for a cancelled job to end"
    ledger = Ledger.in_workdir(campaign.workdir)
    [first, *rest] = ledger.attempts("r000")
    assert "left behind" in (first.reason or "") and rest
    assert [force for job, force in backends[0].cancels if job == first.job_id] == [False, True]
    assert ledger.run("r000").status == "completed"
    ledger.close()


# --- item 11: submit_as_array without scheduler arrays honours parallel_runs ---------------------


def test_submit_as_array_on_a_backend_without_arrays_honours_parallel_runs(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, sweep={"grid": {"workload.seed": [1, 2, 3]}}, parallel_runs=1, submit_as_array=True,
                      workload=api_workload(60))
    report = drill(spec)
    spans = sorted((a["started"], a["ended"]) for run in report["runs"] for a in run["attempts"])
    assert len(spans) == 3 and all(run["status"] == "completed" for run in report["runs"])
    for (_, ended), (started, _) in zip(spans, spans[1:], strict=False):
        assert started >= ended, f"two runs ran at once with parallel_runs 1: {spans}"


# --- item 13: a local cancel ends every process of the job ---------------------------------------


def test_cancelling_a_hung_local_chainer_job_kills_every_rank(tmp_path: Path) -> None:
    if importlib.util.find_spec("chainer") is None:
        pytest.skip("chainer is not installed")
    spec = write_spec(
        tmp_path, workload={"framework": "chainer", "params": 20000, "steps": 1500, "seed": 3, "batch_size": 16},
        faults=[{"kind": "hang-rank", "after": {"fixed": 0.2}, "anchor": "first_checkpoint", "rank": 1}],
        restart={"max_restarts": 2, "poll_interval_s": 0.05, "hang_timeout_s": 2.0, "checkpoint_timeout_s": 5.0},
    )
    run_dir = tmp_path / "work" / "runs" / "r000"
    try:
        report = drill(spec)
        run = run_of(report, "r000")
        assert run["status"] == "completed" and run["attempts"][0]["reason"].startswith("hang")
        left = wait_for(lambda: not drill_processes(run_dir, attempt=0) or None, 10, "attempt 0's ranks to end")
        assert left
    finally:
        leftovers = drill_processes(run_dir)
        kill_verified(leftovers)
    assert not leftovers, f"processes of the cancelled job outlived it: {[p.pid for p in leftovers]}"


def _start_a_grandchild_and_wait(marker: str) -> None:
    """A task (rank) that starts a process of its own, as a data loader or a user's script does."""
    import subprocess as sp
    import time as clock

    child = sp.Popen(["sleep", "300"])
    Path(marker).write_text(str(child.pid))
    clock.sleep(300)


def test_a_local_cancel_kills_the_jobs_whole_process_tree(tmp_path: Path) -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the task cannot import this module
    marker = tmp_path / "grandchild"
    executor = EnvLocalExecutor(tmp_path / "submitit", {"FAULTDRILL_RUN_ID": "r"})
    executor.update_parameters(tasks_per_node=1, timeout_min=5)
    job = executor.submit(_start_a_grandchild_and_wait, str(marker))
    backend = LocalBackend("d")
    backend._jobs[job.job_id] = LocalJobRecord(folder=tmp_path / "submitit", ntasks=1, process=job._process)
    grandchild = wait_for(lambda: marker.exists() and marker.read_text() and int(marker.read_text()), 60,
                          "the task's own process")
    try:
        backend.cancel(job.job_id)
        gone = wait_for(lambda: None if _running(grandchild) else "gone", 10, "the task's own process to end")
        assert gone == "gone"
    finally:
        if _running(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        job._process.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_only_processes_verified_as_the_jobs_are_signalled(tmp_path: Path) -> None:
    """An adopted job id that is not a submitit controller of this run (a reused pid) is left alone."""
    backend = LocalBackend("d")
    spec = write_spec(tmp_path)
    run = Controller(load_campaign(spec)).runs[0]
    job = RankJob(run_id=run.run_id, run_dir=str(run.paths.root), attempt=0, workload=run.workload,
                  checkpoint_every=20, checkpoint_keep=2)
    backend.adopt(str(os.getpid()), run, job)  # this test process: not the run's job
    child = subprocess.Popen(["sleep", "30"])
    try:
        backend.cancel(str(os.getpid()), force=True)  # must not kill us, nor our children
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_job_the_drill_cancelled_is_known_as_such_to_a_restarted_controller(tmp_path: Path) -> None:
    """in-allocation: the drill could not end attempt 0's hung launch and cancelled the job the next
    attempt was to run in. The thread records it in the ledger before it asks the scheduler (the
    hardening issue's item 2: the loop recorded it a round later), so a controller started later,
    even one right after the scancel, takes that job's end for the drill's doing, not a person's."""
    from orchestrator.campaign.failure_classes import DrillEnded

    spec = write_spec(tmp_path, restart={"strategy": "in-allocation"})
    controller = Controller(load_campaign(spec))
    run = controller.runs[0]
    why = DrillEnded("HANG", "attempt 0's hung launch could not be ended alone")
    with ThreadPoolExecutor(1) as pool:
        tracker = RunTracker(run, [], controller.backend, controller.ledger, pool, controller.drill_id)
        tracker.begin_attempt(0)
        controller.ledger.update_attempt(run.run_id, 0, job_id="4242")
        recorded_when_asked: list[str | None] = []

        def ask(job_id: str, force: bool = False) -> None:  # the ledger as a controller started now reads it
            [row] = Ledger(controller.ledger.path).attempts(run.run_id)
            recorded_when_asked.append(row.ended_by_drill)
        tracker.cancels.ask = ask  # type: ignore[method-assign]  # the test's, to see what is asked
        worker = threading.Thread(target=tracker.cancels.from_thread, args=(0, "4242", why))
        worker.start()
        worker.join(timeout=10)
        assert len(recorded_when_asked) == 1 and recorded_when_asked[0] and "HANG" in recorded_when_asked[0]
        assert tracker.cancels.ended_by_drill == {"4242": why}
        later = RunTracker(run, [], controller.backend, controller.ledger, pool, controller.drill_id)
        assert later.cancels.ended_by_drill == {"4242": why}
    controller.close()


class GoWatchingBackend(LocalBackend):
    """A local backend whose hung-launch kill waits until the next attempt's go was given (the
    kill's thread late, as under load) and notes the moment it was told to kill before."""

    def __init__(self, drill_id: str, go_given: threading.Event) -> None:
        super().__init__(drill_id)
        self.go_given = go_given
        self.started_before: list[float] = []

    def offers(self, capability: Capability) -> bool:
        if capability is Capability.KILL_RANK_STEP:  # the kill's thread runs late: after the go
            self.go_given.wait(timeout=10)
            time.sleep(0.05)  # and later still: five ticks of the process clock past it
        return super().offers(capability)

    def kill_rank_step(self, job_id: str, attempt: int, started_before: float) -> bool:
        self.started_before.append(started_before)
        return True


def test_a_hung_launchs_kill_spares_ranks_started_after_the_next_attempts_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """in-allocation, a hang: the kill of the hung launch runs in a thread, and the job relaunches
    on the go (the fence naming the next attempt). A new rank between its fork and its exec still
    shows the first attempt's environment: the kill must spare whatever started after the moment the
    controller decided, before the go, however late its thread runs (it once took that moment itself:
    a relaunch under load lost a rank to it and the run took a third attempt)."""
    from experiments.runtime.fence import write_fence, write_fence_unless_ahead
    from experiments.runtime.identity import ticks_now
    from orchestrator.observe.watch import AttemptWatch, FailureSign

    spec = write_spec(tmp_path, restart={"strategy": "in-allocation", "max_restarts": 2})
    controller = Controller(load_campaign(spec))
    run = controller.runs[0]
    go_given, go_ticks = threading.Event(), []

    def noting_the_go(write: Callable[..., Any]) -> Callable[..., Any]:
        def fence_then_note(paths: RunPaths, fence: Any, *args: Any) -> None:
            write(paths, fence, *args)
            if fence.attempt == 1 and fence.job_id is not None:  # the go: the attempt and its job
                go_ticks.append(ticks_now())
                go_given.set()
        return fence_then_note

    # the tracker's fence writes: its own, and its acceptance's (never behind a later attempt)
    monkeypatch.setattr("orchestrator.control.tracker.write_fence", noting_the_go(write_fence))
    monkeypatch.setattr("orchestrator.control.tracker.write_fence_unless_ahead", noting_the_go(write_fence_unless_ahead))
    backend = GoWatchingBackend(controller.drill_id, go_given)
    with ThreadPoolExecutor(1) as pool:
        tracker = RunTracker(run, [], backend, controller.ledger, pool, controller.drill_id)
        tracker.begin_attempt(0)
        tracker.accept(0, Submission("4243", accepted_at=time.time()))
        watch = AttemptWatch(attempt=0, job_id="4243", paths=run.paths, ranks=run.ranks, state=JobState.RUNNING)
        now = time.time()
        tracker._on_failure(watch, FailureSign("hang: no heartbeat from rank 1 for 6 s", now - 6, "last_heartbeat",
                                               rank=1), JobState.RUNNING, now)
        wait_for(lambda: backend.started_before, timeout_s=10, what="the hung launch's kill")
        assert [row.attempt for row in controller.ledger.attempts(run.run_id)] == [0, 1]
    controller.close()
    assert backend.started_before[0] <= go_ticks[0], "the kill would take ranks the next attempt started"
