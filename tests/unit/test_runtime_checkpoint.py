import json
import logging
import time
from pathlib import Path

import pytest

from experiments.layout import MANIFEST_NAME, read_json_lines
from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore, ValidCheckpoint, file_hash
from experiments.runtime.persist import PersistWorker

META = CheckpointMeta(framework="test", format="raw bytes", writers="all")

def _newest(store: CheckpointStore, verify_hashes: bool = True) -> ValidCheckpoint:
    """The newest valid checkpoint, which the test's store holds."""
    found = store.newest_valid(verify_hashes=verify_hashes)
    assert found is not None, "no valid checkpoint"
    return found



def write_checkpoint(store: CheckpointStore, step: int, ranks: int = 2, attempt: int = 0) -> Path:
    """What the runner does: every rank writes through a sink, then rank 0 commits."""
    started = time.monotonic()
    for rank in range(ranks):
        sink = store.sink(step, rank)
        sink.write_bytes(f"rank{rank}.bin", f"state of rank {rank} at step {step}".encode() * 10)
        sink.close()
    store.commit(step, attempt, META, started, blocking_s=0.001, ranks=ranks)
    return store.step_dir(step)


def test_commit_publishes_manifest_and_record(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=0)
    path = write_checkpoint(store, 10)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["step"] == 10 and manifest["framework"] == "test" and manifest["writers"] == "all"
    assert set(manifest["files"]) == {"rank0.bin", "rank1.bin"}
    assert manifest["hash_algorithm"] == "blake3"  # the package is Faultdrill's own dependency
    assert manifest["files"]["rank0.bin"] == file_hash(path / "rank0.bin", "blake3")
    assert manifest["bytes"] == sum(manifest["sizes"].values()) > 0
    assert manifest["persist_s"] >= 0 and manifest["blocking_s"] == 0.001
    assert not store.partial_dir(10).exists()
    [record] = read_json_lines(store.paths.checkpoint_log)
    assert record["step"] == 10 and record["path"] == str(path) and record["files"] == manifest["files"]


def test_the_manifest_takes_the_hashes_the_writers_took_and_reads_nothing_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file is hashed while its fsync runs; the commit reads no payload byte again (the old
    store's re-read cost 2.4x the disk's floor) but still hashes a file a receipt left unhashed."""
    store = CheckpointStore(tmp_path, keep=0)
    sink = store.sink(10, 0)
    sink.write_bytes("a.bin", b"a" * 100_000)
    scratch_file = tmp_path / "by-path.bin"
    scratch_file.write_bytes(b"b" * 5000)
    sink.adopt(scratch_file, "b.bin")  # a framework that writes by path (TensorFlow)
    sink.close()
    expected = {name: file_hash(sink.directory / name, "blake3") for name in ("a.bin", "b.bin")}
    receipt = json.loads((sink.directory / ".receipt-rank00000.json").read_text())
    assert receipt["hashes"] == expected and receipt["files"] == {"a.bin": 100_000, "b.bin": 5000}
    assert receipt["hash_algorithm"] == "blake3"

    def no_reading(path: Path, algorithm: str) -> str:
        raise AssertionError(f"the commit read {path} back")

    monkeypatch.setattr("experiments.runtime.checkpoint.file_hash", no_reading)
    record = store.commit(10, 0, META, time.monotonic(), blocking_s=None)
    assert record.files == expected
    monkeypatch.undo()

    unhashed = store.sink(20, 0)
    unhashed.write_bytes("c.bin", b"c" * 10)
    unhashed.hashes.clear()  # a receipt as an older writer left it: sizes only
    unhashed.close()
    assert store.commit(20, 0, META, time.monotonic(), blocking_s=None).files == {
        "c.bin": file_hash(store.step_dir(20) / "c.bin", "blake3")}


def test_sync_commit_counts_blocking_as_persist(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    sink = store.sink(5)
    sink.write_bytes("a", b"x")
    sink.close()
    record = store.commit(5, 0, META, time.monotonic(), blocking_s=None)
    assert record.blocking_s == record.persist_s


def test_newest_valid_is_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (10, 20, 30):
        write_checkpoint(store, step)
    found = store.newest_valid()
    assert found is not None and found.step == 30 and found.manifest["step"] == 30


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    newest = write_checkpoint(store, 20)
    data = bytearray((newest / "rank1.bin").read_bytes())
    data[3] ^= 0xFF  # same size, different bytes: only the hash can tell
    (newest / "rank1.bin").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        found = store.newest_valid()
    assert found is not None and found.step == 10
    assert "step-00000020" in caplog.text and "rank1.bin: blake3 mismatch" in caplog.text


def test_truncated_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    newest = write_checkpoint(store, 20)
    with open(newest / "rank0.bin", "r+b") as handle:
        handle.truncate(5)
    assert _newest(store).step == 10
    assert "size 5 bytes" in (store.scan()[0].problem or "")
    # A quick size-only scan (login node) catches truncation without reading the data.
    assert _newest(store, verify_hashes=False).step == 10


@pytest.mark.parametrize("damage", ["missing manifest", "garbled manifest", "missing file", "wrong step"])
def test_damaged_checkpoints_are_skipped(tmp_path: Path, damage: str) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    newest = write_checkpoint(store, 20)
    manifest = newest / MANIFEST_NAME
    if damage == "missing manifest":
        manifest.unlink()
    elif damage == "garbled manifest":
        manifest.write_text('{"step": 20, "files": ')
    elif damage == "missing file":
        (newest / "rank0.bin").unlink()
    else:
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "step": 7}))
    assert _newest(store).step == 10
    assert store.scan()[0].problem is not None and store.scan()[1].problem is None


def test_nothing_valid_means_cold_start(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.newest_valid() is None
    (write_checkpoint(store, 10) / MANIFEST_NAME).unlink()
    assert store.newest_valid() is None


def test_keep_prunes_oldest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30, 40):
        write_checkpoint(store, step)
    assert [step for step, _ in store.published()] == [40, 30]  # out of sight at once
    store.wait_pruned()
    assert sorted(p.name for p in store.root.iterdir()) == ["step-00000030", "step-00000040"]  # and deleted
    assert [r["step"] for r in read_json_lines(store.paths.checkpoint_log)] == [10, 20, 30, 40]


def test_partial_directory_ignored_then_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    store.sink(20).write_bytes("rank0.bin", b"half a checkpoint")  # writer died before commit
    assert _newest(store).step == 10
    assert store.remove_stale() == [store.partial_dir(20)]
    assert not store.partial_dir(20).exists()  # its name free at once for this attempt
    store.wait_pruned()
    assert [p.name for p in store.root.iterdir()] == ["step-00000010"]  # and its bytes deleted


def test_sink_leaves_no_file_under_final_name_when_writer_fails(tmp_path: Path) -> None:
    sink = CheckpointStore(tmp_path).sink(1)
    with pytest.raises(RuntimeError):
        with sink.open("model.bin") as handle:
            handle.write(b"partial")
            raise RuntimeError("killed mid-write")
    assert list(sink.directory.iterdir()) == []
    with pytest.raises(ValueError):
        sink.write_bytes(MANIFEST_NAME, b"{}")


def test_discard_newer_than_and_rewrite_same_step(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    (write_checkpoint(store, 20) / "rank0.bin").unlink()
    assert _newest(store).step == 10
    [moved] = store.discard_newer_than(10)
    assert not store.step_dir(20).exists()
    assert moved.parent == store.paths.quarantine and (moved / "rank1.bin").exists()  # moved aside, not deleted
    write_checkpoint(store, 20, attempt=1)  # the resumed attempt writes step 20 again
    assert _newest(store).manifest["attempt"] == 1


def test_commit_replaces_an_invalid_directory_of_the_same_step(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (write_checkpoint(store, 20) / MANIFEST_NAME).unlink()
    write_checkpoint(store, 20, attempt=1)
    assert _newest(store).manifest["attempt"] == 1


def test_persist_worker_publishes_in_order_and_surfaces_errors(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    worker = PersistWorker()
    for step in (1, 2):
        sink = store.sink(step)
        sink.write_bytes("a", b"x")
        sink.close()
        worker.submit(lambda step=step: store.commit(step, 0, META, time.monotonic(), 0.0))
    worker.wait()
    assert [r.step for r in worker.records] == [1, 2]

    def fail() -> None:
        raise OSError("disk full")

    worker.submit(fail)  # type: ignore[arg-type]  # a job that fails, returning no record
    with pytest.raises(RuntimeError, match="publishing a checkpoint failed"):
        worker.wait()
