"""Asynchronous persist (issue 11): training waits only for a rank's snapshot of its state; a
thread writes it, makes it durable and (rank 0) publishes it once every rank delivered. The
runner is the real one; the workload is a small NumPy one whose write is slow, as a large model's
is on a slow disk."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from experiments.layout import RankJob, RunPaths, WorkloadSpec, read_json_lines
from experiments.runner import RunnerOptions, run_training
from experiments.runtime.checkpoint import CheckpointStore
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.workloads.base import Workload
from numpy_workload import NumpyWorkload

WRITE_S = 0.25  # each checkpoint's write; a step takes 10 ms, checkpoints are 30 steps apart


def _job(tmp_path: Path, steps: int = 90) -> RankJob:
    return RankJob(run_id="r", run_dir=str(tmp_path), attempt=0, workload=WorkloadSpec(steps=steps),
                   checkpoint_every=30, checkpoint_keep=0, heartbeat_interval_s=0.02)


def _train(tmp_path: Path, workload: Workload, asynchronous: bool) -> float:
    started = time.monotonic()
    run_training(_job(tmp_path), DistEnv.from_environ({}, hostname="test"), workload, started_at=time.time(),
                 options=RunnerOptions(timeouts=Timeouts(checkpoint_s=10), async_persist=asynchronous))
    return time.monotonic() - started


def test_training_waits_for_the_snapshot_only_and_every_checkpoint_holds_its_own_step(tmp_path: Path) -> None:
    workload = NumpyWorkload(WRITE_S)
    _train(tmp_path, workload, asynchronous=True)
    records = read_json_lines(RunPaths(tmp_path).checkpoint_log)
    assert [record["step"] for record in records] == [30, 60, 90], "published in step order"
    # Training went on while each write ran (the last one's write outlives the training's last step).
    assert set(workload.steps_during_write) == {30, 60}, workload.steps_during_write
    for record in records:
        assert record["blocking_s"] < record["persist_s"], record
    store = CheckpointStore(tmp_path)
    for step in (30, 60, 90):  # the state of its step, not of a later one the training had reached
        weights = np.frombuffer((store.step_dir(step) / "weights.bin").read_bytes())
        assert weights.tolist() == [step * (step + 1) / 2] * 4

    synchronous = tmp_path / "sync"
    blocking = NumpyWorkload(WRITE_S)
    _train(synchronous, blocking, asynchronous=False)
    assert blocking.steps_during_write == {}, "a synchronous save holds training for its write"
    for record in read_json_lines(RunPaths(synchronous).checkpoint_log):
        assert record["blocking_s"] == record["persist_s"] >= WRITE_S


def test_a_write_that_fails_in_the_background_fails_the_rank_within_a_step_and_publishes_nothing(
        tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="publishing a checkpoint failed: .*checkpoint step 30 could not be written"):
        _train(tmp_path, NumpyWorkload(WRITE_S, fail_at=30), asynchronous=True)
    beats = read_json_lines(RunPaths(tmp_path).heartbeat_file(0, 0))
    steps_after = max(beat["step"] for beat in beats) - 30
    assert steps_after <= WRITE_S / 0.01 + 5, f"trained {steps_after} steps past the failed write"
    assert not read_json_lines(RunPaths(tmp_path).checkpoint_log)
