"""Long checkpoint phases are not hangs (issue 7, item 8): a rank announces its resume, checkpoint
and finish phases in its heartbeat with their own timeout, and the controller's hang rule honours it.

The runner is the real one; the workload is a small NumPy one whose save takes longer than the hang
timeout, as a large model's does on slow storage."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from experiments.layout import RankJob, RunPaths, WorkloadSpec, append_json_line, read_json_lines
from experiments.runner import RunnerOptions, run_training
from experiments.runtime.distenv import DistEnv, Timeouts
from numpy_workload import NumpyWorkload
from orchestrator.observe.watch import AttemptWatch, RankBeat
from orchestrator.states import JobState

HANG_TIMEOUT_S = 0.5
SAVE_S = 1.5  # three hang timeouts
CHECKPOINT_TIMEOUT_S = 5.0


def test_a_checkpoint_longer_than_the_hang_timeout_is_no_hang_but_its_own_timeout_holds(tmp_path: Path) -> None:
    job = RankJob(run_id="r", run_dir=str(tmp_path), attempt=0, workload=WorkloadSpec(steps=30),
                  checkpoint_every=10, checkpoint_keep=1, heartbeat_interval_s=0.02)
    env = DistEnv.from_environ({}, hostname="test")
    options = RunnerOptions(timeouts=Timeouts(checkpoint_s=CHECKPOINT_TIMEOUT_S), async_persist=False)
    errors: list[BaseException] = []

    def train() -> None:
        try:
            run_training(job, env, NumpyWorkload(SAVE_S), started_at=time.time(), options=options)
        except BaseException as error:  # handed to the test thread
            errors.append(error)

    trainer = threading.Thread(target=train)
    trainer.start()
    watch = AttemptWatch(attempt=0, job_id="j", paths=RunPaths(tmp_path), ranks=1)
    watch.observe_state(JobState.RUNNING, time.time())
    verdicts = []
    while trainer.is_alive():
        watch.read()
        verdicts.append(watch.hang(time.time(), HANG_TIMEOUT_S))
        time.sleep(0.05)
    trainer.join()
    assert not errors, errors
    assert not [v for v in verdicts if v is not None], f"taken for a hang: {[v for v in verdicts if v]}"
    phases = {beat.get("phase") for beat in _beats(tmp_path)}
    assert {"resume", "checkpoint", "finish"} <= phases

    # A rank that never comes back from its checkpoint phase: a hang once the phase's own timeout is
    # spent (not before), and the verdict names the phase.
    watch.beats = {0: RankBeat(time=100.0, allowed_s=CHECKPOINT_TIMEOUT_S, phase="checkpoint")}
    assert watch.hang(100.0 + CHECKPOINT_TIMEOUT_S - 0.1, HANG_TIMEOUT_S) is None
    verdict = watch.hang(100.0 + CHECKPOINT_TIMEOUT_S + 0.1, HANG_TIMEOUT_S)
    assert verdict is not None and "checkpoint phase" in verdict.reason and verdict.at == 100.0


def test_time_suspended_by_the_scheduler_is_not_silence(tmp_path: Path) -> None:
    watch = AttemptWatch(attempt=0, job_id="j", paths=RunPaths(tmp_path), ranks=1)
    watch.observe_state(JobState.RUNNING, 0.0)
    watch.beats = {0: RankBeat(time=10.0, allowed_s=None)}
    assert watch.hang(10.0 + HANG_TIMEOUT_S + 1, HANG_TIMEOUT_S) is not None
    watch.observe_state(JobState.SUSPENDED, 10.2)
    assert watch.hang(200.0, HANG_TIMEOUT_S) is None
    watch.observe_state(JobState.RUNNING, 200.0)  # resumed: the clock starts again
    assert watch.hang(200.0 + HANG_TIMEOUT_S - 0.1, HANG_TIMEOUT_S) is None
    assert watch.hang(200.0 + HANG_TIMEOUT_S + 0.1, HANG_TIMEOUT_S) is not None


def _beats(run_dir: Path) -> list[dict]:
    return read_json_lines(RunPaths(run_dir).heartbeat_file(0, 0))


def test_start_up_is_known_once_every_rank_registered_and_a_stuck_one_is_a_start_timeout(tmp_path: Path) -> None:
    """The ranks_started anchor (a fault in the start-up) and the stuck start that follows it."""
    paths = RunPaths(tmp_path)
    watch = AttemptWatch(attempt=0, job_id="j", paths=paths, ranks=2)
    watch.observe_state(JobState.RUNNING, 50.0)
    for rank in range(2):
        watch.read()
        assert watch.ranks_started is None, "not every rank has registered yet"
        paths.rank_file(0, rank).parent.mkdir(parents=True, exist_ok=True)
        paths.rank_file(0, rank).write_text("{}")
    watch.read()
    assert watch.ranks_started == paths.rank_file(0, 1).stat().st_mtime
    assert watch.stuck_start(50.0 + 20.0, 20.0) is None, "within start_timeout_s"
    stuck = watch.stuck_start(50.0 + 20.5, 20.0)
    assert stuck is not None and stuck.evidence == "job_running" and stuck.reason.startswith("no training step within 20 s")


def test_time_suspended_does_not_count_toward_the_start_timeout(tmp_path: Path) -> None:
    """Issue 21, item 6: suspended for 100 s during its start-up, resumed, a job is not stuck 1 s
    later; it is once it has run start_timeout_s in all."""
    watch = AttemptWatch(attempt=0, job_id="j", paths=RunPaths(tmp_path), ranks=1)
    watch.observe_state(JobState.RUNNING, 50.0)
    watch.observe_state(JobState.SUSPENDED, 55.0)  # 5 s of start-up so far
    assert watch.stuck_start(150.0, 20.0) is None, "suspended: no clock runs"
    watch.observe_state(JobState.RUNNING, 155.0)
    assert watch.stuck_start(156.0, 20.0) is None, "6 s of start-up, not 106"
    assert watch.stuck_start(170.0, 20.0) is None, "20 s of start-up: within start_timeout_s"
    stuck = watch.stuck_start(170.5, 20.0)
    assert stuck is not None and stuck.reason.startswith("no training step within 20 s")


@pytest.mark.parametrize("node_ahead_s", [-30.0, 30.0])
def test_silence_is_measured_on_the_controllers_clock_whatever_the_nodes_says(tmp_path: Path,
                                                                            node_ahead_s: float) -> None:
    """Hardening issue, item 10: a node's clock 30 s behind made every beat look 30 s old (a false
    HANG); one 30 s ahead hid a hang for 30 s. Silence counts from when the controller read the beat."""
    paths = RunPaths(tmp_path)
    watch = AttemptWatch(attempt=0, job_id="j", paths=paths, ranks=1)
    watch.observe_state(JobState.RUNNING, 1000.0)
    append_json_line(paths.heartbeat_file(0, 0), {"attempt": 0, "step": 5, "time": 1000.0 + node_ahead_s})
    watch.read(1000.1)
    assert watch.hang(1000.2, HANG_TIMEOUT_S) is None, "a fresh beat taken for silence"
    assert watch.hang(1000.1 + HANG_TIMEOUT_S - 0.1, HANG_TIMEOUT_S) is None
    verdict = watch.hang(1000.1 + HANG_TIMEOUT_S + 0.1, HANG_TIMEOUT_S)
    assert verdict is not None and verdict.at == 1000.0 + node_ahead_s, "the evidence keeps the rank's own stamp"
