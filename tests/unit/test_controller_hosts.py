"""Issue 22, item 11: two login nodes share a workdir. ``controller.json`` names the host; from
another host a controller is live while its lock file's time moves (no pid, no clock compared);
stop and cancel name the host to run them on; a second controller is refused even where the lock
did not stop it (NFS local_lock, Lustre localflock); a filesystem with no locks is a clear error."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.control import detach
from orchestrator.control.detach import (
    IDENTITY_NAME,
    LOCK_NAME,
    ControllerBusy,
    ControllerElsewhere,
    ControllerLock,
    live_controller,
    read_identity,
    stop_controller,
)


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detach, "LEASE_S", 0.6)
    monkeypatch.setattr(detach, "RENEW_S", 0.1)


def write_foreign(workdir: Path, host: str = "login2", pid: int = 4242) -> None:
    """controller.json as a controller on ``host`` wrote it (its lock file beside it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / LOCK_NAME).touch()
    record = {"pid": pid, "start_ticks": 1, "started": time.time(), "argv": ["faultdrill", "drill"], "host": host}
    (workdir / IDENTITY_NAME).write_text(json.dumps(record))


@pytest.fixture
def renewing(tmp_path: Path) -> Iterator[Path]:
    """A workdir whose controller runs on login2 and renews its lock file, as detach's renewer does there."""
    workdir = tmp_path / "work"
    write_foreign(workdir)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.1):
            stamp = time.time_ns()
            os.utime(workdir / LOCK_NAME, ns=(stamp, stamp))

    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    yield workdir
    stop.set()
    thread.join()


def test_a_controller_on_another_host_is_live_while_its_lock_file_is_renewed(renewing: Path) -> None:
    found = live_controller(renewing)
    assert found is not None and found.host == "login2" and found.elsewhere


def test_stop_from_another_host_names_the_host_instead_of_signalling_a_pid(renewing: Path) -> None:
    with pytest.raises(ControllerElsewhere, match="pid 4242 on login2.*run this command on login2"):
        stop_controller(renewing)


def test_a_second_controller_is_refused_where_the_lock_did_not_stop_it(renewing: Path) -> None:
    """The lock here is free (a node-local lock), but the controller on login2 renews its lease."""
    with pytest.raises(ControllerElsewhere, match="drives .* locks do not reach across hosts.*on login2"):
        with ControllerLock(renewing):
            pass
    holder = read_identity(renewing)
    assert holder is not None and holder.host == "login2", "the refused one wrote nothing"


def test_a_dead_controller_on_another_host_is_none_and_its_workdir_taken(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    write_foreign(workdir)  # its lock file's time never moves: it died (or its host did)
    assert live_controller(workdir) is None
    with ControllerLock(workdir):
        mine = read_identity(workdir)
        assert mine is not None and (mine.pid, mine.host) == (os.getpid(), socket.gethostname())


def test_the_controller_renews_its_lock_file_and_records_its_host(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    with ControllerLock(workdir):
        assert detach.lease_moves(workdir)
        record = json.loads((workdir / IDENTITY_NAME).read_text())
        assert record["host"] == socket.gethostname()
    assert not detach.lease_moves(workdir), "renewals stop with the controller"


def test_a_record_written_before_hosts_were_named_is_taken_for_this_host(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    write_foreign(workdir, host="")
    identity = read_identity(workdir)
    assert identity is not None and not identity.elsewhere


def test_a_filesystem_without_locks_is_a_clear_error_before_anything_starts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def no_locks(*_: object) -> None:  # Lustre mounted noflock
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(detach.fcntl, "flock", no_locks)
    workdir = tmp_path / "work"
    with pytest.raises(ControllerBusy, match="no file locks .*noflock.*local disk"):
        with ControllerLock(workdir):
            pass
    assert not (workdir / IDENTITY_NAME).exists()


def test_a_controller_paused_past_its_lease_stops_and_leaves_its_successors_record(tmp_path: Path) -> None:
    """Review of issue 22: a controller stopped (Ctrl-Z) past its lease while one on another host
    took the workdir came back, drove beside it, and unlinked its controller.json at exit."""
    workdir = tmp_path / "work"
    lost: list[object] = []
    with ControllerLock(workdir, on_lost=lost.append):
        write_foreign(workdir, host="login2", pid=777)  # the successor's record, written while this one slept
        end = time.monotonic() + 5
        while not lost and time.monotonic() < end:
            time.sleep(0.05)
    assert lost and getattr(lost[0], "host", None) == "login2", "this controller is told to stop"
    holder = read_identity(workdir)
    assert holder is not None and holder.pid == 777, "the successor's record stays"

