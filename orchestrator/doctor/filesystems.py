"""The filesystems a drill writes to, as the login node sees them: whether flock works there (the
controller's lock and the ledger's), whether a rename replaces a file atomically (every record and
checkpoint is published that way), and their type (a network filesystem shows other nodes' writes
late and is unsafe for SQLite's WAL)."""

from __future__ import annotations

import errno
import fcntl
import os
import uuid
from pathlib import Path

from experiments.runtime.mounts import UNKNOWN, filesystem_type, is_local
from orchestrator.doctor.checks import Check, Status, failed, passed, warned

NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


def check_directory(name: str, directory: Path) -> list[Check]:
    """Writable, flock, atomic rename, and the filesystem's type, for ``directory`` (made if absent)."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # as a drill makes its workdir
    except OSError as error:
        return [failed(name, f"{directory}: cannot be made ({error.strerror})", "name a directory you may write")]
    probe = directory / f".faultdrill-doctor-{uuid.uuid4().hex[:8]}"
    try:
        return [_lock(name, directory, probe), _rename(name, directory, probe), _kind(name, directory)]
    finally:
        for leftover in (probe, probe.with_suffix(".renamed")):
            leftover.unlink(missing_ok=True)


def check_ledger_directory(directory: Path) -> list[Check]:
    """The spec's ``ledger_dir``: the ledger is kept there while the drill runs because the workdir's
    filesystem is not safe for SQLite, so it must be this host's own disk (flock, a rename, a local
    type); a network filesystem there fails, since it defeats the field's one purpose."""
    checks = check_directory("ledger_dir", directory)
    kind = filesystem_type(directory) if directory.is_dir() else UNKNOWN
    if directory.is_dir() and not is_local(kind):
        said = "a filesystem the mount table does not name" if kind == UNKNOWN else kind
        checks = [check for check in checks if check.name != "ledger_dir: filesystem"]
        checks.append(failed("ledger_dir: filesystem", f"{directory} is on {said}, not this host's own disk: the "
                             "ledger's locks and journal there are only as safe as the workdir's",
                             "name a ledger_dir on the login node's local disk (e.g. /var/tmp or /tmp)"))
    return checks


def check_checkpoint_directory(directory: Path) -> list[Check]:
    """The spec's ``checkpoint.directory`` (its deepest directory without ``{run_id}``): a rename
    there replaces a file at once (every checkpoint is published, and a damaged one kept aside, by a
    rename within it), and its filesystem. Not made here: one that does not exist yet (the drill
    makes it) is checked at its nearest existing parent."""
    name = "checkpoints"
    existing = nearest_existing(directory)
    said = [] if existing == directory else [passed(name, f"{directory} does not exist yet (the drill makes it): "
                                                           f"checked at its nearest existing parent, {existing}")]
    probe = existing / f".faultdrill-doctor-{uuid.uuid4().hex[:8]}"
    try:
        return [*said, _rename(name, existing, probe), _lock_said(name, existing, probe),
                passed(f"{name}: filesystem", f"{existing} is on {filesystem_type(existing)}")]
    finally:
        for leftover in (probe, probe.with_suffix(".renamed")):
            leftover.unlink(missing_ok=True)


def nearest_existing(directory: Path) -> Path:
    """``directory`` if it exists, else its nearest parent that does."""
    return next(path for path in (directory, *directory.parents) if path.is_dir())


def _lock(name: str, directory: Path, probe: Path) -> Check:
    try:
        with open(probe, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as error:
        if error.errno in NO_LOCKS:
            return failed(f"{name}: flock", f"{directory}: flock is not supported here ({error.strerror})",
                          "mount it with locking (Lustre: -o flock), or put the workdir on a filesystem that has it")
        return failed(f"{name}: flock", f"{directory}: {error.strerror}", "name a directory you may write")
    return passed(f"{name}: flock", f"{directory}: flock works")


def _lock_said(name: str, directory: Path, probe: Path) -> Check:
    """flock in the checkpoint directory: the drill takes none there, so a filesystem without it is
    said (a framework's or the script's own checkpointing may lock its files), never a failure."""
    found = _lock(name, directory, probe)
    if found.status is Status.FAIL:
        return warned(found.name, found.detail, "the drill takes no lock there; a script or framework that locks "
                      "its checkpoint files would fail: mount it with locking, or check that yours does not lock")
    return found


def _rename(name: str, directory: Path, probe: Path) -> Check:
    target = probe.with_suffix(".renamed")
    try:
        target.write_text("old")
        probe.write_text("new")
        os.replace(probe, target)
        ok = target.read_text() == "new"
    except OSError as error:
        return failed(f"{name}: rename", f"{directory}: a rename failed ({error.strerror})",
                      "name a directory where files can be replaced by rename")
    if not ok:
        return failed(f"{name}: rename", f"{directory}: a rename did not replace the file",
                      "name a directory where files can be replaced by rename")
    return passed(f"{name}: rename", f"{directory}: a rename replaces a file at once")


def _kind(name: str, directory: Path) -> Check:
    kind = filesystem_type(directory)
    if not is_local(kind):
        said = "a filesystem the mount table does not name" if kind == UNKNOWN else kind
        return warned(f"{name}: filesystem", f"{directory} is on {said}, not one known to be this host's own: "
                      "treated as a network filesystem (other nodes may see its files late, through attribute "
                      "caches, and every write may be a round trip to a server)",
                      "the drill waits for what it reads, writes heartbeats at most once a second there, and keeps "
                      "its ledger with a rollback journal (SQLite's WAL is unsafe on a network filesystem); "
                      "a spec's `ledger_dir` on the login node's local disk keeps the ledger off it")
    return passed(f"{name}: filesystem", f"{directory} is on {kind}")

