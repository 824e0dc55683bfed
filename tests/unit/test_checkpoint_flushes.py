"""The store's flushes (issue 24, goal 3): rank 0's files are flushed while it goes on, and the
commit waits for them with the manifest's and the partial directory's before the rename that
publishes; a flush that fails publishes nothing. Also the writeback hint's file and the prune
that deletes off the saving thread."""

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from experiments.runtime import checkpoint as checkpoint_module
from experiments.runtime import sink as sink_module
from experiments.runtime.checkpoint import CheckpointIncomplete, CheckpointMeta, CheckpointStore
from experiments.runtime.sink import WritebackFile

pytestmark = pytest.mark.unit

META = CheckpointMeta(framework="test", format="raw bytes", writers="all")


def _deliver_rank0(store: CheckpointStore, step: int, payload: bytes) -> None:
    sink = store.sink(step, 0)
    sink.write_bytes("rank0.bin", payload)
    sink.close()


def _record_flushes(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, int]]) -> None:
    """Record every fsync as it returns (by the inode its descriptor names: a file's name changes on
    its way) and every rename (by the inode renamed), in order."""
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        inode = os.fstat(fd).st_ino
        real_fsync(fd)
        events.append(("fsync", inode))  # when it returned: a flush not waited for is not before the publish

    def rename(source: str | Path, target: str | Path) -> None:
        events.append(("rename", os.stat(source).st_ino))
        real_rename(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)


def test_every_file_the_manifest_and_the_directory_are_flushed_before_the_publish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    events: list[tuple[str, int]] = []
    _record_flushes(monkeypatch, events)
    started = time.monotonic()
    for rank in range(2):
        sink = store.sink(7, rank)
        sink.write_bytes(f"rank{rank}.bin", b"x" * 100_000)
        sink.write_bytes(f"extra{rank}.bin", b"y" * 10)
        sink.close()
    store.commit(7, 0, META, started, None, ranks=2)
    final = store.step_dir(7)
    publish = events.index(("rename", final.stat().st_ino))
    flushed_first = {inode for kind, inode in events[:publish] if kind == "fsync"}
    for name in ("rank0.bin", "extra0.bin", "rank1.bin", "extra1.bin", "manifest.json"):
        assert (final / name).stat().st_ino in flushed_first, f"{name} was not flushed before the publish"
    assert final.stat().st_ino in flushed_first  # the directory: every name in it
    assert ("fsync", store.root.stat().st_ino) in events[publish:]


def test_rank_zeros_flush_runs_on_while_it_writes_and_the_commit_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer's write returns before its file's fsync ends; the commit does not return before."""
    store = CheckpointStore(tmp_path)
    real_fsync = os.fsync
    flushing: list[str] = []
    release = threading.Event()

    def held_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "rank0.bin" in path:
            release.wait(10)  # held until the rank has gone on
            flushing.append(path)
        real_fsync(fd)

    monkeypatch.setattr(sink_module.os, "fsync", held_fsync)
    started = time.monotonic()
    _deliver_rank0(store, 3, b"z" * 1000)
    assert not flushing  # still flushing: the rank went on
    release.set()
    store.commit(3, 0, META, started, None, ranks=1)
    assert len(flushing) == 1  # waited for before the publish
    assert store.newest_valid() is not None


@pytest.mark.parametrize(("code", "says"), [
    (errno.EIO, "Input/output error"),
    # ext4 and NFS may report a full disk only at the fsync (delayed allocation): the commit names it
    (errno.ENOSPC, "checkpoint step 4 could not be written: no space left on device"),
])
def test_a_flush_that_fails_publishes_nothing_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, says: str) -> None:
    store = CheckpointStore(tmp_path)
    _failing_flush_of(monkeypatch, "rank0.bin", code)
    started = time.monotonic()
    _deliver_rank0(store, 4, b"w" * 1000)
    with pytest.raises(OSError, match=says):
        store.commit(4, 0, META, started, None, ranks=1)
    assert not store.step_dir(4).exists() and store.published() == []
    assert store.newest_valid() is None


def test_the_logged_persist_time_runs_to_the_publish_and_a_synchronous_save_blocks_for_all_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    real_fsync_dir = checkpoint_module.fsync_dir

    def slow_root_fsync(directory: Path) -> None:
        if Path(directory) == store.root:
            time.sleep(0.2)  # after the manifest was written: only the publish's own time
        real_fsync_dir(directory)

    monkeypatch.setattr(checkpoint_module, "fsync_dir", slow_root_fsync)
    started = time.monotonic()
    _deliver_rank0(store, 5, b"v" * 10)
    record = store.commit(5, 0, META, started, None, ranks=1)
    assert record.persist_s >= 0.2 and record.blocking_s == record.persist_s


def test_the_writeback_file_writes_every_byte_in_order_and_hints_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hints: list[tuple[int, int]] = []
    monkeypatch.setattr(sink_module, "start_writeback", lambda fd, offset, length: hints.append((offset, length)) or True)
    monkeypatch.setattr(WritebackFile, "WRITEBACK_BYTES", 1000)
    payload = os.urandom(4500)
    with open(tmp_path / "f", "wb") as handle:
        target = WritebackFile(handle)
        assert target.write(payload[:10]) == 10
        assert target.write(memoryview(payload)[10:]) == 4490  # split into pieces of WRITEBACK_BYTES
        target.flush()
        assert target.tell() == 4500
    assert (tmp_path / "f").read_bytes() == payload
    assert hints and hints[0][0] == 0
    assert all(later[0] == earlier[0] + earlier[1] for earlier, later in zip(hints, hints[1:], strict=False))  # contiguous
    assert sum(length for _, length in hints) <= 4500


def test_a_pruned_checkpoint_leaves_sight_at_once_and_its_bytes_go_off_the_saving_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    deleting = []
    release = threading.Event()
    real_rmtree = checkpoint_module.shutil.rmtree

    def held_rmtree(path: Path, ignore_errors: bool = False) -> None:
        release.wait(10)  # held until the save has returned
        deleting.append(Path(path).name)
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", held_rmtree)
    for step in (1, 2):
        started = time.monotonic()
        _deliver_rank0(store, step, b"u" * 10)
        store.commit(step, 0, META, started, None, ranks=1)
    assert [step for step, _ in store.published()] == [2]
    assert deleting == []  # the save did not wait for the deletion
    release.set()
    store.wait_pruned()
    assert len(deleting) == 1 and deleting[0].startswith(".step-00000001.trash-")
    assert sorted(p.name for p in store.root.iterdir()) == ["step-00000002"]


def _failing_flush_of(monkeypatch: pytest.MonkeyPatch, name: str, code: int = errno.EIO) -> None:
    """Every fsync of a file whose path holds ``name`` fails with ``code``."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(sink_module.os, "fsync", fsync)


def test_a_save_that_failed_before_its_flushes_does_not_fail_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of goal 3: a commit that stopped before its flushes (a rank delivered nothing) left
    rank 0's pending flush to the next step's commit, which failed with it."""
    store = CheckpointStore(tmp_path)
    _failing_flush_of(monkeypatch, "step-00000001")
    _deliver_rank0(store, 1, b"a" * 100)
    with pytest.raises(CheckpointIncomplete):
        store.commit(1, 0, META, time.monotonic(), None, ranks=2)  # rank 1 delivered nothing
    _deliver_rank0(store, 2, b"b" * 100)
    store.commit(2, 0, META, time.monotonic(), None, ranks=1)
    assert _newest_step(store) == 2


def test_a_save_never_committed_does_not_fail_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose ranks never met (no commit at all: the receipts' wait timed out) is let go by
    the next save's sink."""
    store = CheckpointStore(tmp_path)
    _failing_flush_of(monkeypatch, "step-00000001")
    _deliver_rank0(store, 1, b"a" * 100)
    _deliver_rank0(store, 2, b"b" * 100)
    store.commit(2, 0, META, time.monotonic(), None, ranks=1)
    assert _newest_step(store) == 2


def _newest_step(store: CheckpointStore) -> int | None:
    found = store.newest_valid()
    return None if found is None else found.step


def test_rank_zero_holds_a_bounded_number_of_descriptors_however_many_files_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pending flush holds a duplicate descriptor: a share of many files on a slow disk must
    not run the process out of them."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.02)
        real_fsync(fd)

    monkeypatch.setattr(sink_module.os, "fsync", slow_fsync)
    before = len(os.listdir("/proc/self/fd"))
    sink = CheckpointStore(tmp_path).sink(1, 0)
    most = 0
    for index in range(120):
        sink.write_bytes(f"shard{index:03d}.bin", b"s" * 10)
        most = max(most, len(os.listdir("/proc/self/fd")) - before)
    sink.wait_durable()
    assert most <= sink_module._Syncs.MAX_PENDING + 4, most


def test_deletions_slower_than_the_saves_never_pile_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep = 1 and a deletion slower than a save: a save waits for the deletion before its own, so
    at most one old checkpoint is on its way out at any time (never five keeps' worth of bytes)."""
    store = CheckpointStore(tmp_path, keep=1)
    real_rmtree = checkpoint_module.shutil.rmtree

    def slow_rmtree(path: Path, ignore_errors: bool = False) -> None:
        time.sleep(0.1)
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", slow_rmtree)
    most_trash = 0
    for step in range(1, 7):
        _deliver_rank0(store, step, b"p" * 10)
        store.commit(step, 0, META, time.monotonic(), None, ranks=1)
        most_trash = max(most_trash, sum(".trash-" in path.name for path in store.root.iterdir()))
    assert most_trash <= 1, most_trash


def test_a_restart_is_not_kept_waiting_by_the_deletion_of_what_the_last_attempt_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """remove_stale frees the partial directory's name at once and deletes its bytes meanwhile."""
    store = CheckpointStore(tmp_path)
    _deliver_rank0(store, 9, b"left by a dead attempt")
    release, deleted = threading.Event(), threading.Event()
    real_rmtree = checkpoint_module.shutil.rmtree

    def held_rmtree(path: Path, ignore_errors: bool = False) -> None:
        release.wait(2)
        real_rmtree(path, ignore_errors=ignore_errors)
        deleted.set()

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", held_rmtree)
    fresh = CheckpointStore(tmp_path)  # the next attempt's rank 0
    assert fresh.remove_stale() == [fresh.partial_dir(9)]
    assert not deleted.is_set(), "remove_stale waited for the deletion"
    assert not fresh.partial_dir(9).exists()
    release.set()
    fresh.wait_pruned()
    assert list(fresh.root.iterdir()) == []


def test_a_stale_attempt_stopped_by_the_fence_after_hashing_writes_no_manifest(tmp_path: Path) -> None:
    """The fence is asked again after the hashes (they take time): a stale attempt stopped there
    neither writes a manifest nor takes the receipts of the attempt that shares the directory."""
    store = CheckpointStore(tmp_path)
    _deliver_rank0(store, 4, b"f" * 10)
    calls = []

    def fence() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("fenced out: attempt 1 is current")

    with pytest.raises(RuntimeError, match="fenced out"):
        store.commit(4, 0, META, time.monotonic(), None, ranks=1, before_publish=fence)
    partial = store.partial_dir(4)
    assert not (partial / "manifest.json").exists()
    assert (partial / ".receipt-rank00000.json").exists()



def test_a_stale_directory_gone_before_it_is_moved_aside_is_no_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: another attempt published or removed it between the listing and the rename."""
    store = CheckpointStore(tmp_path)
    _deliver_rank0(store, 3, b"left")
    real_rename = os.rename

    def gone_first(source: str | Path, target: str | Path) -> None:
        checkpoint_module.shutil.rmtree(source)
        real_rename(source, target)

    monkeypatch.setattr(checkpoint_module.os, "rename", gone_first)
    assert store.remove_stale() == [store.partial_dir(3)]
    store.wait_pruned()
