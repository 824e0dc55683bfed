"""The rank API in a real process of one rank: resume, checkpoints through the store, progress,
the final record; a second attempt resumes from the newest valid checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.layout import (
    ENV_RANK_JOB,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
    rank_job_to_dict,
    read_json_lines,
)
from experiments.runtime import api
from experiments.runtime.checkpoint import CheckpointStore
from experiments.runtime.digest import digest_arrays


def _environ(tmp_path: Path, attempt: int, steps: int = 6) -> dict[str, str]:
    job = RankJob(run_id="r", run_dir=str(tmp_path / "run"), attempt=attempt, checkpoint_every=2, checkpoint_keep=2,
                  workload=WorkloadSpec(framework="other", steps=steps, seed=4))
    return {ENV_RANK_JOB: json.dumps(rank_job_to_dict(job))}


def _train(rank: api.Rank, start: int, stop: int, weights: np.ndarray) -> None:
    for step in range(start + 1, stop + 1):
        weights += step
        rank.step(step, loss=float(step))
        if rank.should_checkpoint(step):
            with rank.checkpoint(step) as directory:
                np.save(directory / "w.npy", weights)
                (directory / "nested").mkdir()
                (directory / "nested" / "meta.txt").write_text(str(step))


def test_an_attempt_checkpoints_through_the_store_and_the_next_resumes_from_it(tmp_path: Path) -> None:
    rank = api.init(environ=_environ(tmp_path, 0))
    assert rank.resume() is None and (rank.rank, rank.world_size, rank.steps, rank.seed) == (0, 1, 6, 4)
    weights = np.zeros(3)
    _train(rank, 0, 5, weights)  # killed after step 5: checkpoints 2 and 4 exist
    rank._session.persist.wait()
    store = CheckpointStore(tmp_path / "run")
    newest = store.newest_valid()
    assert newest is not None and newest.step == 4
    assert set(newest.manifest["files"]) == {"w.npy", "nested__meta.txt"}

    again = api.init(environ=_environ(tmp_path, 1))
    loaded: list[int] = []
    found = again.resume(lambda directory, step: loaded.append(int((directory / "nested__meta.txt").read_text())))
    assert found is not None and found.step == 4 and loaded == [4]
    weights = np.load(found.path / "w.npy")
    _train(again, found.step, again.steps, weights)
    digest = again.done(weights={"w": weights})
    final = json.loads(RunPaths(tmp_path / "run").final.read_text())
    assert final == {**final, "step": 6, "attempt": 1, "digest": digest} and digest == digest_arrays([("w", weights)])
    events = [e["event"] for e in attempt_event_lines(RunPaths(tmp_path / "run"), 1)]
    assert events == ["process_start", "framework_ready", "checkpoint_loaded", "first_step", "completed"]
    paths = RunPaths(tmp_path / "run")
    beats = read_json_lines(paths.heartbeat_file(0, 0)) + read_json_lines(paths.heartbeat_file(1, 0))
    # Rate-limited, but always written at a checkpoint: attempt 0 reported step 4 at least.
    assert beats[-1]["attempt"] == 1 and max(b["step"] for b in beats if b["attempt"] == 0) in (4, 5)


def test_a_checkpoint_that_raises_or_holds_no_file_is_not_published(tmp_path: Path) -> None:
    rank = api.init(environ=_environ(tmp_path, 0))
    rank.resume()
    with pytest.raises(ZeroDivisionError):
        with rank.checkpoint(2) as directory:
            (directory / "half").write_bytes(b"x")
            raise ZeroDivisionError("the script's own error, mid-checkpoint")
    with pytest.raises(RuntimeError) as error:
        with rank.checkpoint(4):
            pass
        rank._session.persist.wait()
    assert "no rank wrote a file" in str(error.value.__cause__)
    assert CheckpointStore(tmp_path / "run").newest_valid() is None


def test_the_api_refuses_misuse_with_a_reason(tmp_path: Path) -> None:
    rank = api.init(environ=_environ(tmp_path, 0))
    with pytest.raises(RuntimeError, match="call resume"):
        rank.step(1)
    rank.resume()
    with pytest.raises(RuntimeError, match="once per process"):
        rank.resume()
    with pytest.raises(ValueError, match="final weights or a digest"):
        rank.done()
    with pytest.raises(ValueError, match="init\\(steps=...\\)"):
        api.init(environ={})


def test_a_synchronous_checkpoint_is_published_when_its_block_ends(tmp_path: Path) -> None:
    rank = api.init(environ=_environ(tmp_path, 0), async_persist=False)
    rank.resume()
    rank.step(1)
    with rank.checkpoint(2) as directory:
        (directory / "state.bin").write_bytes(b"state")
    newest = CheckpointStore(tmp_path / "run").newest_valid()  # no wait: it is there already
    assert newest is not None and newest.step == 2 and (newest.path / "state.bin").read_bytes() == b"state"
    assert newest.manifest["blocking_s"] == newest.manifest["persist_s"]
