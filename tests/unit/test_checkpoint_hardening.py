"""The checkpoint store under storage faults (issue 7, items 4 and 5): a read error never deletes a
checkpoint, a rank that delivered nothing keeps a checkpoint from being published, and a checkpoint
a rank failed to load is left out of the next attempt's choice."""

from __future__ import annotations

import builtins
import errno
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from experiments.layout import MANIFEST_NAME, attempt_event_lines, read_json_lines
from experiments.runtime import verify
from experiments.runtime.checkpoint import CheckpointIncomplete, CheckpointMeta, CheckpointStore, ValidCheckpoint

META = CheckpointMeta("test", "raw", "all")


def _newest(store: CheckpointStore, verify_hashes: bool = True) -> ValidCheckpoint:
    """The newest valid checkpoint, which the test's store holds."""
    found = store.newest_valid(verify_hashes=verify_hashes)
    assert found is not None, "no valid checkpoint"
    return found



def _write(store: CheckpointStore, step: int, ranks: int = 2, attempt: int = 0, skip_rank: int | None = None) -> None:
    for rank in range(ranks):
        if rank == skip_rank:
            continue  # this rank's share never arrived (its writer or its storage lost it)
        sink = store.sink(step, rank)
        sink.write_bytes(f"rank{rank}.bin", f"rank {rank} step {step}".encode() * 20)
        sink.close()
    store.commit(step, attempt, META, time.monotonic(), 0.0, ranks=ranks)


def _failing_manifest_reads(monkeypatch: pytest.MonkeyPatch, path: Path, failures: int) -> list[int]:
    """open() of ``path``'s manifest raises EIO the first ``failures`` times (as NFS does, ESTALE/EIO)."""
    calls = [0]
    real_open = builtins.open

    def flaky_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(file) == path / MANIFEST_NAME:
            calls[0] += 1
            if calls[0] <= failures:
                raise OSError(errno.EIO, "Input/output error", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", flaky_open)
    monkeypatch.setattr(verify, "READ_RETRY_DELAYS_S", (0.0, 0.0, 0.0))
    return calls


def test_a_transient_read_error_is_retried_and_the_checkpoint_used(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    _write(store, 10)
    calls = _failing_manifest_reads(monkeypatch, store.step_dir(10), failures=2)
    found = store.newest_valid()
    assert found is not None and found.step == 10
    assert calls[0] >= 3


def test_a_checkpoint_that_cannot_be_read_is_moved_aside_never_deleted(tmp_path: Path, monkeypatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    # keep: 1 — the only checkpoint there is: deleting it would lose all the work.
    store = CheckpointStore(tmp_path, keep=1)
    _write(store, 10)
    _failing_manifest_reads(monkeypatch, store.step_dir(10), failures=10**6)
    with caplog.at_level(logging.WARNING):
        assert store.newest_valid() is None  # kept out of the choice ...
        moved = store.discard_newer_than(0)  # ... by the resume of the next attempt
    monkeypatch.undo()
    assert not store.step_dir(10).exists()
    [aside] = moved
    assert aside.parent == store.paths.quarantine
    assert sorted(p.name for p in aside.iterdir()) == [MANIFEST_NAME, "rank0.bin", "rank1.bin"]  # every byte kept
    assert "unreadable" in caplog.text and "moved checkpoint" in caplog.text
    [entry] = read_json_lines(store.paths.quarantine / "index.jsonl")
    assert entry["to"] == str(aside) and "not usable" in entry["reason"]


def test_a_checkpoint_missing_a_ranks_share_is_not_published(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _write(store, 10)
    with pytest.raises(CheckpointIncomplete, match="rank 1 of 2 delivered no receipt"):
        _write(store, 20, skip_rank=1)
    assert not store.step_dir(20).exists()
    assert _newest(store).step == 10


def test_a_file_lost_after_its_receipt_is_not_published(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for rank in range(2):
        sink = store.sink(30, rank)
        sink.write_bytes(f"rank{rank}.bin", b"x" * 64)
        sink.close()
    (store.partial_dir(30) / "rank1.bin").unlink()
    with pytest.raises(CheckpointIncomplete, match="rank1.bin is listed by a receipt but missing"):
        store.commit(30, 0, META, time.monotonic(), 0.0, ranks=2)
    assert store.newest_valid() is None


def test_the_manifest_lists_what_the_ranks_delivered(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    sink = store.sink(5, 0)
    sink.write_bytes("model.bin", b"m" * 10)
    sink.close()
    (store.partial_dir(5) / "stray.bin").write_bytes(b"nobody wrote this through a sink")
    store.sink(5, 1).close()  # a rank with nothing to write (TensorFlow's non-chief) still delivers
    record = store.commit(5, 0, META, time.monotonic(), 0.0, ranks=2)
    assert set(record.files) == {"model.bin"}
    assert not any(p.name.startswith(".receipt") for p in store.step_dir(5).iterdir())


def test_a_checkpoint_a_rank_failed_to_load_is_skipped_next_time(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _write(store, 10)
    _write(store, 20)
    store.reject(20, rank=1, attempt=3, error="UnpicklingError: invalid load key")
    found = store.newest_valid()
    assert found is not None and found.step == 10
    assert store.scan()[0].problem_kind == "rejected" and "rank 1 of attempt 3" in (store.scan()[0].problem or "")
    # The next attempt resumes at 10, writes 20 again: that new checkpoint is not the rejected one.
    store.discard_newer_than(10)
    _write(store, 20, attempt=4)
    assert _newest(store).step == 20


def _torch_attempt(run_dir: Path, steps: int, attempt: int) -> str:
    from experiments.layout import RankJob, WorkloadSpec
    from experiments.runner import RunnerOptions, run_training
    from experiments.runtime.distenv import DistEnv
    from experiments.workloads import get_workload
    from rank_launch import free_port

    job = RankJob(run_id="t", run_dir=str(run_dir), attempt=attempt,
                  workload=WorkloadSpec(params=3000, steps=steps, batch_size=8),
                  checkpoint_every=10, checkpoint_keep=3, heartbeat_interval_s=0.0)
    env = DistEnv.from_environ({"FAULTDRILL_MASTER_PORT": str(free_port())}, hostname="test")
    return run_training(job, env, get_workload("torch"), started_at=0.0, options=RunnerOptions()).digest


@pytest.mark.drill  # torch
def test_a_torch_checkpoint_that_fails_to_load_makes_the_next_attempt_fall_back(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    from experiments.runtime.checkpoint import file_hash

    straight = _torch_attempt(tmp_path / "straight", steps=40, attempt=0)
    run_dir = tmp_path / "broken"
    _torch_attempt(run_dir, steps=25, attempt=0)  # checkpoints at 10 and 20, then the attempt "dies"
    store = CheckpointStore(run_dir)
    newest = store.step_dir(20)
    # Bytes that hash as the manifest says (a writer's bug, not storage): only loading finds out.
    (newest / "model.pt").write_bytes(b"not a torch file" * 100)
    manifest = json.loads((newest / MANIFEST_NAME).read_text())
    manifest["files"]["model.pt"] = file_hash(newest / "model.pt", manifest["hash_algorithm"])
    manifest["sizes"]["model.pt"] = (newest / "model.pt").stat().st_size
    (newest / MANIFEST_NAME).write_text(json.dumps(manifest))
    import torch.distributed as dist

    with pytest.raises(Exception):  # noqa: B017  (whatever the rank dies of: its rejection record is checked)
        _torch_attempt(run_dir, steps=40, attempt=1)
    dist.destroy_process_group()  # what the failed rank's exit does
    [rejection] = read_json_lines(store.paths.checkpoint_rejections)
    assert rejection["step"] == 20 and rejection["attempt"] == 1
    assert _torch_attempt(run_dir, steps=40, attempt=2) == straight  # resumed from 10, bit for bit
    loaded = [e for e in attempt_event_lines(store.paths, 2) if e["event"] == "checkpoint_loaded"]
    assert loaded[0]["step"] == 10


def test_retention_deletes_the_last_valid_checkpoint_only_after_a_newer_one_is_verified(tmp_path: Path) -> None:
    # keep: 1 — the only valid checkpoint stays until a newer one passed the publication checks.
    store = CheckpointStore(tmp_path, keep=1)
    _write(store, 10)
    with pytest.raises(CheckpointIncomplete):
        _write(store, 20, skip_rank=1)  # a newer one that is not complete: never published
    assert store.step_dir(10).exists() and _newest(store).step == 10
    _write(store, 30)  # verified (every rank's receipt, every size) and published: now 10 may go
    assert [step for step, _ in store.published()] == [30]
    assert _newest(store).step == 30


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory on another filesystem than tmp_path's (/dev/shm, a tmpfs): checkpoints on scratch,
    the run directory in home, the usual HPC layout."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    directory = Path(tempfile.mkdtemp(prefix="faultdrill-scratch-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_damaged_checkpoint_on_another_filesystem_is_moved_aside_there(tmp_path: Path, scratch: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if os.stat(run_dir).st_dev == os.stat(scratch).st_dev:
        pytest.skip("/dev/shm is on tmp_path's filesystem here")
    (run_dir / "checkpoints").symlink_to(scratch)  # as the disk-full drills and a site's scratch do
    store = CheckpointStore(run_dir, keep=2)
    _write(store, 10)
    _write(store, 20)
    (store.step_dir(20) / "rank1.bin").write_bytes(b"torn")
    assert store.newest_valid().step == 10
    [aside] = store.discard_newer_than(10)  # EXDEV into <run>/quarantine before: the resume died every attempt
    assert not store.step_dir(20).exists() and (aside / "rank1.bin").read_bytes() == b"torn"
    assert os.stat(aside).st_dev == os.stat(scratch).st_dev, "moved aside on the checkpoints' filesystem"
    [entry] = read_json_lines(store.paths.quarantine / "index.jsonl")
    assert entry["to"] == str(aside)
