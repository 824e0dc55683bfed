"""Checkpoints hashed with BLAKE3 (Faultdrill's own environment) and the sha256 ones written before
it both verify, and both are rejected when damaged; a checkpoint that cannot be checked here (its
algorithm's package missing, or an algorithm unknown) is never passed unchecked, and the store stops
there rather than fall back past it or set it aside (the run's progress is kept)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from experiments.layout import MANIFEST_NAME
from experiments.runtime import integrity
from experiments.runtime.checkpoint import CheckpointStore, CheckpointUncheckable, file_hash
from experiments.runtime.verify import INVALID, UNCHECKABLE, check_checkpoint
from tests.unit.test_runtime_checkpoint import META, write_checkpoint


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF  # same size, different bytes: only the hash can tell
    path.write_bytes(bytes(data))


def _as_an_older_writer_left_it(checkpoint: Path) -> None:
    """A manifest of the store before BLAKE3: sha256 per file, no algorithm named."""
    manifest = json.loads((checkpoint / MANIFEST_NAME).read_text())
    del manifest["hash_algorithm"]
    manifest["version"] = 2
    manifest["files"] = {name: hashlib.sha256((checkpoint / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_a_new_checkpoint_is_hashed_with_blake3_and_a_damaged_one_is_rejected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    checkpoint = write_checkpoint(store, 10)
    manifest, problem = check_checkpoint(checkpoint, 10)
    assert problem is None and manifest is not None and manifest["hash_algorithm"] == "blake3"
    import blake3

    assert manifest["files"]["rank0.bin"] == blake3.blake3((checkpoint / "rank0.bin").read_bytes()).hexdigest()
    _damage(checkpoint / "rank0.bin")
    _, problem = check_checkpoint(checkpoint, 10)
    assert problem is not None and problem.kind == INVALID and str(problem) == "rank0.bin: blake3 mismatch"


def test_a_sha256_checkpoint_of_an_older_store_verifies_and_is_rejected_when_damaged(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 10)
    old = write_checkpoint(store, 20)
    _as_an_older_writer_left_it(old)
    assert check_checkpoint(old, 20)[1] is None
    found = store.newest_valid()
    assert found is not None and found.step == 20  # the old one is the newest valid
    _damage(old / "rank1.bin")
    _, problem = check_checkpoint(old, 20)
    assert problem is not None and problem.kind == INVALID and str(problem) == "rank1.bin: sha256 mismatch"
    found = store.newest_valid()
    assert found is not None and found.step == 10  # fell back past the damaged sha256 one


def test_a_receipt_of_an_older_writer_is_hashed_again_under_the_manifests_algorithm(tmp_path: Path) -> None:
    """A rank that hashed with sha256 (an older writer, or an environment without blake3) beside
    one that hashed with BLAKE3: the manifest names one algorithm, every file's hash under it."""
    store = CheckpointStore(tmp_path)
    old_writer = store.sink(10, 0)
    old_writer.write_bytes("rank0.bin", b"zero" * 1000)
    receipt = old_writer.directory / ".receipt-rank00000.json"
    old_writer.close()
    said = json.loads(receipt.read_text())
    receipt.write_text(json.dumps({"rank": 0, "files": said["files"],
                                   "sha256": {"rank0.bin": hashlib.sha256(b"zero" * 1000).hexdigest()}}))
    new_writer = store.sink(10, 1)
    new_writer.write_bytes("rank1.bin", b"one" * 1000)
    new_writer.close()
    record = store.commit(10, 0, META, time.monotonic(), blocking_s=None, ranks=2)
    assert record.hash_algorithm == "blake3"
    assert record.files == {name: file_hash(store.step_dir(10) / name, "blake3") for name in ("rank0.bin", "rank1.bin")}
    assert check_checkpoint(store.step_dir(10), 10)[1] is None


def test_without_blake3_a_store_writes_sha256_and_cannot_pass_a_blake3_checkpoint_unchecked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    written_with_blake3 = write_checkpoint(store, 10)
    monkeypatch.setattr(integrity, "_blake3", lambda: None)  # a training environment without the package
    assert integrity.default_algorithm() == "sha256"
    written_without = write_checkpoint(store, 20)
    manifest, problem = check_checkpoint(written_without, 20)
    assert problem is None and manifest is not None and manifest["hash_algorithm"] == "sha256"
    _, problem = check_checkpoint(written_with_blake3, 10)
    assert problem is not None and problem.kind == UNCHECKABLE
    assert "blake3, which this Python lacks (pip install blake3" in str(problem)
    # and with the hash unchecked on purpose (verify_hashes=False), sizes alone pass it
    assert check_checkpoint(written_with_blake3, 10, verify_hashes=False)[1] is None


def test_a_rank_that_cannot_check_the_newest_checkpoint_stops_and_keeps_every_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Helper 36's review: rank 0 in an environment without blake3 took the run's BLAKE3
    checkpoints for unusable, moved them all aside and started cold; the next attempt had nothing."""
    store = CheckpointStore(tmp_path)
    for step in (10, 20):
        write_checkpoint(store, step)
    monkeypatch.setattr(integrity, "_blake3", lambda: None)
    with pytest.raises(CheckpointUncheckable, match=r"step-00000020: rank0.bin: cannot be checked here: hashed with blake3, "
                                                    r"which this Python lacks \(pip install blake3"):
        store.newest_valid()
    monkeypatch.undo()
    assert [step for step, _ in store.published()] == [20, 10] and not store.paths.quarantine.exists()
    found = store.newest_valid()
    assert found is not None and found.step == 20


def test_an_algorithm_this_version_does_not_know_is_unreadable_and_named(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(CheckpointStore(tmp_path), 10)
    manifest = json.loads((checkpoint / MANIFEST_NAME).read_text())
    manifest["hash_algorithm"] = "md5"
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))
    _, problem = check_checkpoint(checkpoint, 10)
    assert problem is not None and problem.kind == UNCHECKABLE  # a newer version's, perhaps
    assert "unknown hash algorithm 'md5'; valid: blake3, sha256" in str(problem)
    manifest["hash_algorithm"] = None
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))
    _, problem = check_checkpoint(checkpoint, 10)
    assert problem is not None and problem.kind == INVALID and "garbled manifest (hash_algorithm None)" in str(problem)


def test_a_fresh_file_is_hashed_on_every_core_only_while_training_waits(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Helper 47: BLAKE3 took every core of the node for a file an asynchronous save's persist thread
    hashed while the node's ranks trained on. The main thread's save (training waits) keeps them."""
    from concurrent.futures import ThreadPoolExecutor

    real = integrity._blake3()
    made: list[int] = []

    class Recording:
        AUTO = real.AUTO

        def __init__(self, max_threads: int = 1) -> None:
            made.append(max_threads)
            self._hasher = real()

        def update_mmap(self, path: Path) -> "Recording":
            self._hasher.update(Path(path).read_bytes())
            return self

        def hexdigest(self) -> str:
            return str(self._hasher.hexdigest())

    monkeypatch.setattr(integrity, "_blake3", lambda: Recording)
    path = tmp_path / "shard"
    path.write_bytes(b"x" * 1000)
    waited = integrity.digest_fresh_file(path, integrity.BLAKE3)
    with ThreadPoolExecutor(max_workers=1) as persist:
        beside = persist.submit(integrity.digest_fresh_file, path, integrity.BLAKE3).result()
    assert waited == beside == real(b"x" * 1000).hexdigest()
    assert made == [real.AUTO, 1]
