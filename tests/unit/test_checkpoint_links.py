"""Faults act only on the run's own regular files (security issue 28, item 7): a file a script
wrote as a symlink or a hard link to something outside the run (shared pretrained weights) is
published as a copy of the checkpoint's own, and corrupt-checkpoint never follows a link."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from experiments.runtime.sink import FileSink
from experiments.runtime.verify import file_hash
from injectors.kinds.corrupt_checkpoint import _damage, _victim
from injectors.targets import TargetRefused

pytestmark = pytest.mark.unit


def _shared_weights(tmp_path: Path) -> tuple[Path, str]:
    shared = tmp_path / "shared" / "pretrained.bin"
    shared.parent.mkdir()
    shared.write_bytes(os.urandom(4096))
    return shared, hashlib.sha256(shared.read_bytes()).hexdigest()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_linked_file_is_published_as_a_copy_and_what_it_named_is_left_alone(tmp_path: Path, link: str) -> None:
    shared, digest = _shared_weights(tmp_path)
    scratch, checkpoint = tmp_path / "scratch", tmp_path / "step-00000010"
    scratch.mkdir()
    checkpoint.mkdir()
    written = scratch / "weights.bin"
    (written.symlink_to if link == "symlink" else written.hardlink_to)(shared)
    sink = FileSink(checkpoint)
    sink.adopt(written, "weights.bin")
    published = checkpoint / "weights.bin"
    assert not published.is_symlink() and os.stat(published).st_nlink == 1
    assert os.stat(published).st_ino != os.stat(shared).st_ino
    assert sink.hashes["weights.bin"] == file_hash(shared, sink.algorithm) and not written.exists()
    _damage(_victim(checkpoint, None), "flip")  # the fault damages the checkpoint's copy ...
    assert hashlib.sha256(shared.read_bytes()).hexdigest() == digest  # ... never the shared file


def test_corrupt_checkpoint_never_picks_or_opens_a_link(tmp_path: Path) -> None:
    shared, digest = _shared_weights(tmp_path)
    checkpoint = tmp_path / "step-00000010"
    checkpoint.mkdir()
    (checkpoint / "big.bin").symlink_to(shared)  # the largest "file": a link
    (checkpoint / "also.bin").hardlink_to(shared)
    (checkpoint / "own.bin").write_bytes(b"x" * 100)
    assert _victim(checkpoint, None).name == "own.bin"
    with pytest.raises(TargetRefused):
        _victim(checkpoint, "big.bin")
    with pytest.raises(OSError):  # O_NOFOLLOW: a link put in its place since it was chosen
        _damage(checkpoint / "big.bin", "flip")
    assert hashlib.sha256(shared.read_bytes()).hexdigest() == digest
