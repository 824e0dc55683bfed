"""Which filesystem a path is on, and whether the drill may treat it as local (review of issue 22:
SQLite's WAL and the fast heartbeat only where the filesystem is known to be one host's own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.runtime.mounts import filesystem_type, on_network_filesystem

pytestmark = pytest.mark.unit


def _mounted(point: Path, kind: str) -> str:
    return f"22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n40 22 0:50 / {point} rw - {kind} server:/x rw\n"


@pytest.mark.parametrize("kind", ["fuse.ceph-fuse", "afs", "9p", "virtiofs", "fuse.juicefs", "fuse.gcsfuse",
                                  "nfs", "lustre", "some-new-fs", "fuse.sshfs"])
def test_a_filesystem_not_known_to_be_local_is_treated_as_shared(tmp_path: Path, kind: str) -> None:
    assert on_network_filesystem(tmp_path / "ledger.sqlite", _mounted(tmp_path, kind)), kind


@pytest.mark.parametrize("kind", ["ext4", "xfs", "btrfs", "tmpfs", "zfs", "f2fs", "overlay"])
def test_the_known_local_filesystems_are_local(tmp_path: Path, kind: str) -> None:
    assert not on_network_filesystem(tmp_path / "ledger.sqlite", _mounted(tmp_path, kind)), kind


def test_an_unreadable_mount_table_is_treated_as_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.runtime import mounts

    monkeypatch.setattr(mounts, "MOUNTINFO", tmp_path / "no-such-mountinfo")
    assert filesystem_type(tmp_path) == "?"
    assert on_network_filesystem(tmp_path)


@pytest.mark.parametrize(("character", "escape"), [("\t", "\\011"), ("\n", "\\012"), ("\\", "\\134"), (" ", "\\040")])
def test_every_octal_escape_of_the_mount_table_is_decoded(tmp_path: Path, character: str, escape: str) -> None:
    odd = tmp_path / f"a{character}b"
    written = str(odd).replace(character, escape)
    assert filesystem_type(odd / "ledger.sqlite", _mounted(Path(written), "nfs4")) == "nfs4"
