"""Issue 21, item 10: sbatch (60 s) and scancel (3 x 20 s) ran on the controller's loop, so a
scheduler in a brownout stalled every run's watch. Submissions and the drill's cancels now run off
the loop for backends whose commands are slow (orchestrator/backends/scheduler_calls.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.layout import RankJob
from orchestrator.backends.base import Submission
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.runs import RunConfig, expand_runs
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.states import JobState
from simulated_cluster import HANG, KILL, SimulatedCluster

pytestmark = pytest.mark.unit

BROWNOUT_S = 5.0  # how long the slow sbatch waits at most (the test releases it earlier when it passes)


class Brownout(SimulatedCluster):
    """A cluster whose sbatch or scancel for one attempt hangs until released (a brownout);
    its commands are slow, so the controller runs them off its loop."""

    slow_commands = True

    def __init__(self, slow: tuple[str, int], **options: Any) -> None:
        super().__init__(**options)
        self.slow, self.released, self.lock = slow, threading.Event(), threading.RLock()
        self.slow_asked = threading.Event()
        self.slow_answered_at: float | None = None

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        if (run.run_id, job.attempt) == self.slow:
            self.slow_asked.set()
            self.released.wait(BROWNOUT_S)
            self.slow_answered_at = self.slow_answered_at or time.monotonic()  # the first answer
        with self.lock:
            return super().submit(run, job)

    def cancel(self, job_id: str, force: bool = False) -> None:
        sim = self.jobs.get(job_id)
        if sim is not None and (sim.run.run_id, sim.job.attempt) == self.slow:
            self.slow_asked.set()
            self.released.wait(BROWNOUT_S)
            self.slow_answered_at = self.slow_answered_at or time.monotonic()  # the first answer
        with self.lock:
            super().cancel(job_id, force)

    def requeue(self, job_id: str) -> None:
        sim = self.jobs.get(job_id)
        if sim is not None and sim.run.run_id == self.slow[0]:  # the run's job, as whatever attempt
            self.slow_asked.set()
            self.released.wait(BROWNOUT_S)
            self.slow_answered_at = self.slow_answered_at or time.monotonic()  # the first answer
        with self.lock:
            super().requeue(job_id)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        with self.lock:
            return super().poll(job_ids)


def _spec(tmp_path: Path, strategy: str = "resubmit") -> Path:
    spec = {
        "name": "brownout", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"strategy": strategy, "max_restarts": 2, "poll_interval_s": 0.01, "hang_timeout_s": 0.2},
        "parallel_runs": 2, "baseline": False,
        "sweep": {"grid": {"workload.seed": [0, 1]}},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("held", ["sbatch", "scancel", "scontrol requeue"])
def test_a_command_the_scheduler_holds_up_stalls_no_other_run(tmp_path: Path, held: str) -> None:
    """r000's resubmission hangs in sbatch (or, after its hang, the drill's scancel of its job; or,
    under the requeue strategy, the requeue of its job); meanwhile r001's failure is detected, its
    run restarted and completed. Then the scheduler answers r000's command, and r000 completes too."""
    campaign = load_campaign(_spec(tmp_path, "requeue" if held == "scontrol requeue" else "resubmit"))
    runs = sorted(run.run_id for run in expand_runs(campaign))
    slow, failure = ((runs[0], 1), KILL) if held != "scancel" else ((runs[0], 0), HANG)
    cluster = Brownout(slow=slow, failures={(runs[0], 0): failure, (runs[1], 0): KILL}, polls_to_finish=6)
    controller = Controller(campaign, backend=cluster)
    seen: dict[str, float] = {}

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        if cluster.slow_asked.is_set() and not cluster.released.is_set():
            seen.setdefault("blocked", time.monotonic())
            if controller.ledger.run(runs[1]).status == "completed":
                seen["other_completed"] = time.monotonic()
                cluster.released.set()

    try:
        assert controller.run(observe)
        statuses = {run_id: controller.ledger.run(run_id).status for run_id in runs}
    finally:
        cluster.released.set()
        controller.close()
    assert cluster.slow_answered_at is not None and "other_completed" in seen
    assert seen["other_completed"] < cluster.slow_answered_at, "the other run waited for the hung command"
    assert statuses == dict.fromkeys(runs, "completed")


def test_a_resubmissions_fence_moves_at_once_and_is_made_durable_off_the_loop(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a restart's fence writes no longer wait on the disk on the controller's loop. r000's
    resubmission hangs in sbatch: meanwhile its fence already names attempt 1 (the failed job is
    fenced off at once), and no fence is fsynced on the loop's thread in the whole drill: the
    submission's call makes it durable before sbatch, and fences the run on the job after it."""
    from experiments.runtime.fence import Fence, read_fence

    campaign = load_campaign(_spec(tmp_path))
    runs = sorted(run.run_id for run in expand_runs(campaign))
    cluster = Brownout(slow=(runs[0], 1), failures={(runs[0], 0): KILL}, polls_to_finish=6)
    synced = _fence_fsyncs(monkeypatch)
    controller = Controller(campaign, backend=cluster)
    while_held: list[Fence | None] = []

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        if cluster.slow_asked.is_set() and not cluster.released.is_set():
            while_held.append(read_fence(trackers[0].run.paths))
            cluster.released.set()

    try:
        assert controller.run(observe)
    finally:
        cluster.released.set()
        controller.close()
    assert while_held and while_held[0] == Fence(1, None, controller.drill_id)
    assert synced and not [sync for sync in synced if sync.thread == threading.main_thread().name], synced
    last = max((sim for sim in cluster.jobs.values() if sim.run.run_id == runs[0]), key=lambda sim: sim.job.attempt)
    assert read_fence(last.run.paths) == Fence(1, last.job_id, controller.drill_id)


@dataclass(frozen=True)
class FenceSync:
    thread: str  # the thread that fsynced it
    text: str  # what it made durable


def _fence_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[FenceSync]:
    """Every fsync of a run's fence (or of its next version, before the rename), in order."""
    import os

    synced: list[FenceSync] = []
    fsync = os.fsync

    def noted_fsync(fd: int) -> None:
        name = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if "current-attempt" in name.name:
            synced.append(FenceSync(threading.current_thread().name, name.read_text().strip()))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", noted_fsync)
    return synced


def test_a_fence_moved_for_a_try_after_a_backoff_is_durable_before_the_backoff(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 29 (helper 55): the fence that fences off a failed job was made durable only
    by the next try's call; with a policy backoff of 30 s, a controller stopped meanwhile never
    made it so (a host crash would bring back the fence that admits the failed job)."""
    from experiments.runtime.fence import read_fence
    from fake_scheduler import FakeScheduler, launch_exited

    spec = yaml.safe_load(_spec(tmp_path).read_text())
    spec["restart"]["policy"] = {"RANK_SIGNAL": {"backoff_s": 30}}
    spec["sweep"] = {"grid": {"workload.seed": [0]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    synced = _fence_fsyncs(monkeypatch)
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(tmp_path / "spec.yaml"), backend=scheduler)
    failed: list[str] = []

    def fail_then_stop_in_the_backoff(trackers: list[Any], touched: list[Any]) -> None:
        tracker = trackers[0]
        if not failed and tracker.job_id:
            launch_exited(tracker.run.paths.root, 0, 137)
            failed.append(tracker.job_id)
        fence = read_fence(tracker.run.paths)
        if fence is not None and fence.attempt == 1:
            controller.stop_requested.set()

    try:
        controller.run(fail_then_stop_in_the_backoff)
    finally:
        controller.close()
    assert not scheduler.called("submit")[1:], "stopped in the backoff, before the next try"
    assert any(sync.text.startswith("1 - ") for sync in synced), synced


def test_inline_calls_keep_their_order_and_raise_a_crash_at_once() -> None:
    """The local backend's (and the tests' fakes'): in order, an error kept for the caller, a
    process-ending exception (a test's crash) raised at once."""
    calls, order = SchedulerCalls(off_loop=False), []
    first = calls.start(lambda: order.append(1))
    failed = calls.start(lambda: (_ for _ in ()).throw(OSError("no")))
    assert first.done() and order == [1] and isinstance(failed.exception(), OSError)

    class Crash(BaseException):
        pass

    def crash() -> None:
        raise Crash()

    with pytest.raises(Crash):
        calls.start(crash)


def _stopped_while_it_hangs(campaign: Any, cluster: Brownout, run_id: str) -> list[Any]:
    """``faultdrill stop`` as the slow command hangs (answered 0.3 s later): the run's attempts as
    the stopped controller left them in the ledger."""
    controller = Controller(campaign, backend=cluster)

    def stop_while_it_hangs(trackers: list[Any], touched: list[Any]) -> None:
        if cluster.slow_asked.is_set() and not controller.stop_requested.is_set():
            controller.stop_requested.set()
            threading.Timer(0.3, cluster.released.set).start()

    try:
        assert controller.run(stop_while_it_hangs) is False
        return controller.ledger.attempts(run_id)
    finally:
        cluster.released.set()
        controller.close()


def test_a_stop_while_sbatch_runs_keeps_its_answer(tmp_path: Path) -> None:
    """Review: ``faultdrill stop`` while an sbatch ran off the loop lost its answer: the attempt
    kept no job id. The loop's end now waits for the commands in flight and records their jobs."""
    campaign = load_campaign(_spec(tmp_path))
    runs = sorted(run.run_id for run in expand_runs(campaign))
    cluster = Brownout(slow=(runs[0], 0))
    [attempt] = _stopped_while_it_hangs(campaign, cluster, runs[0])
    assert attempt.job_id is not None and cluster.states[attempt.job_id] is JobState.PENDING


def test_a_stop_while_a_requeue_runs_keeps_its_answer(tmp_path: Path) -> None:
    """Helper 53: ``faultdrill stop`` while an ``scontrol requeue`` ran off the loop dropped its
    answer: the attempt stayed REQUEUING, and the next controller asked again (which ends the
    attempt the requeue started, or gives the run up when refused). Its answer is taken now."""
    campaign = load_campaign(_spec(tmp_path, "requeue"))
    runs = sorted(run.run_id for run in expand_runs(campaign))
    cluster = Brownout(slow=(runs[0], 1), failures={(runs[0], 0): KILL})
    attempts = _stopped_while_it_hangs(campaign, cluster, runs[0])
    assert [attempt.job_id for attempt in attempts] == [attempts[0].job_id] * 2, "the same job, requeued"
    assert attempts[1].accepted is not None and attempts[1].state != "REQUEUING", attempts[1]


def test_a_cancel_finds_the_job_of_a_submission_no_controller_saw_answered(tmp_path: Path) -> None:
    """A controller killed while sbatch ran leaves an attempt without a job id; the job exists.
    ``faultdrill cancel`` looked at recorded job ids only and left it running: it looks it up."""
    campaign = load_campaign(_spec(tmp_path))
    cluster = SimulatedCluster()
    controller = Controller(campaign, backend=cluster)
    try:
        pools = controller.injector_pools()
        tracker = controller.trackers(pools)[0]
        job = tracker.begin_attempt(0)  # recorded and fenced; then sbatch, whose answer nobody took
        orphan = cluster.submit(tracker.run, job).job_id
        for pool in pools.values():
            pool.shutdown()
        outcome = controller.cancel(confirm_timeout_s=1.0)
    finally:
        controller.close()
    assert cluster.states[orphan] is JobState.CANCELLED and outcome.alive == []
    assert orphan in outcome.cancelled[tracker.run.run_id]


def test_a_restarted_controllers_look_up_does_not_move_a_warm_coordinators_fence_back(tmp_path: Path) -> None:
    """Review of issue 29 (helper 55): a controller killed right after sbatch answered; the job
    starts, a rank dies, and its warm coordinator re-forms the run as attempt 1 (compare-and-set on
    the fence). The restarted controller finds the job by its look-up and adopts it: the fence keeps
    naming attempt 1 (it was moved back to 0, fencing out the job's running generation)."""
    from experiments.runtime.fence import Fence, advance_fence, read_fence
    from fake_scheduler import ControllerCrash, FakeScheduler
    from orchestrator.backends.base import AttemptRef

    spec = yaml.safe_load(_spec(tmp_path, "warm").read_text())
    spec["restart"]["warm_spares"] = 1
    spec["sweep"] = {"grid": {"workload.seed": [0]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))

    class KilledAfterSbatch(FakeScheduler):
        killed = False

        def submit(self, run: RunConfig, job: RankJob) -> Submission:
            submission = super().submit(run, job)
            if not self.killed:
                self.killed = True
                raise ControllerCrash("killed right after sbatch answered")
            return submission

        def find_submitted(self, ref: AttemptRef) -> list[str]:
            return [job for job in self.states if job]  # the one job it took

    scheduler = KilledAfterSbatch()
    controller = Controller(load_campaign(tmp_path / "spec.yaml"), backend=scheduler)
    try:
        with pytest.raises(ControllerCrash):
            controller.run()
    finally:
        controller.close()
    run, drill_id, (job_id,) = controller.runs[0], controller.drill_id, list(scheduler.states)
    scheduler.states[job_id] = JobState.RUNNING
    advance_fence(run.paths, Fence(0, job_id, drill_id), Fence(1, job_id, drill_id))
    restarted = Controller(load_campaign(tmp_path / "spec.yaml"), backend=scheduler)
    try:
        restarted.run(observer=lambda trackers, touched: restarted.stop_requested.set())
    finally:
        restarted.close()
    assert len(scheduler.called("submit")) == 1, "the job was found, not submitted again"
    assert read_fence(run.paths) == Fence(1, job_id, drill_id)
