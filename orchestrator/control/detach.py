"""One controller per workdir, and drills that outlive the terminal they were started from.

The controller holds an exclusive lock on ``<workdir>/controller.lock`` while it drives the drill
and names itself in ``controller.json`` (pid, the kernel's start time of that pid, the command):
a second controller on the same workdir is refused, and ``stop``/``cancel`` signal only a process
that is that controller — the pid alive, with the same start time, and the lock held.
``drill --detach`` starts the same ``drill`` command in a new session, its output in
``controller.log``, and returns once the child holds the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from experiments.runtime.identity import start_ticks

LOCK_NAME = "controller.lock"
IDENTITY_NAME = "controller.json"
LOG_NAME = "controller.log"
EXIT_NAME = "controller-exit.json"
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 120.0  # a fault in flight is let finish (it may owe a node's restore)


class ControllerBusy(RuntimeError):
    """Another controller drives this workdir."""


class NoController(RuntimeError):
    """No live controller drives this workdir."""


@dataclass(frozen=True)
class ControllerIdentity:
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells a reused pid from ours
    started: float
    argv: list[str]


def _gone(identity: ControllerIdentity) -> bool:
    return start_ticks(identity.pid) != identity.start_ticks


class ControllerLock:
    """Held for the life of one controller; ``with ControllerLock(workdir):``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._handle: IO[str] | None = None

    def __enter__(self) -> "ControllerLock":
        self.workdir.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(os.open(self.workdir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            holder = read_identity(self.workdir)
            who = f"pid {holder.pid}, started {time.ctime(holder.started)}" if holder else "another process"
            raise ControllerBusy(
                f"a controller ({who}) already drives {self.workdir}; wait for it, see it with "
                f"`faultdrill status {self.workdir}`, or stop it with `faultdrill stop {self.workdir}`") from None
        self._handle = handle
        pid = os.getpid()
        identity = ControllerIdentity(pid, start_ticks(pid) or 0, time.time(), sys.argv)
        _write_json(self.workdir / IDENTITY_NAME, asdict(identity))
        (self.workdir / EXIT_NAME).unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        (self.workdir / IDENTITY_NAME).unlink(missing_ok=True)
        if self._handle is not None:
            self._handle.close()  # releases the lock
            self._handle = None


@dataclass(frozen=True)
class ControllerExit:
    """How the last controller of a workdir ended (``faultdrill status`` says it)."""

    code: int
    how: str
    ended: float
    pid: int


def record_exit(workdir: Path, code: int, how: str) -> None:
    _write_json(workdir / EXIT_NAME, asdict(ControllerExit(code, how, time.time(), os.getpid())))


def read_exit(workdir: Path) -> ControllerExit | None:
    try:
        data = json.loads((workdir / EXIT_NAME).read_text())
        return ControllerExit(int(data["code"]), str(data["how"]), float(data["ended"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_identity(workdir: Path) -> ControllerIdentity | None:
    try:
        return ControllerIdentity(**json.loads((workdir / IDENTITY_NAME).read_text()))
    except (OSError, json.JSONDecodeError, TypeError):
        return None


def live_controller(workdir: Path) -> ControllerIdentity | None:
    """The controller driving ``workdir``, verified: its lock is held, its pid alive with the start
    time it recorded. None when there is none (a stale identity file is not one)."""
    identity = read_identity(workdir)
    if identity is None or start_ticks(identity.pid) != identity.start_ticks or not _lock_held(workdir):
        return None
    return identity


def _lock_held(workdir: Path) -> bool:
    try:
        with open(workdir / LOCK_NAME, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def start_detached(argv: list[str], workdir: Path) -> ControllerIdentity:
    """Run ``faultdrill <argv>`` in a new session, output to ``<workdir>/controller.log``; return
    once it drives the workdir. Raises RuntimeError with the log's tail if it ended first."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / LOG_NAME
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        log.write(f"\n---- {time.ctime()}: faultdrill {' '.join(argv)}\n".encode())
        log.flush()
        child = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *argv], stdin=devnull, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        identity = live_controller(workdir)
        if identity is not None and identity.pid == child.pid:
            return identity
        code = child.poll()
        if code is not None:
            raise RuntimeError(f"the detached controller ended at once (exit code {code}):\n{_tail(log_path)}")
        time.sleep(0.1)
    raise RuntimeError(f"the detached controller (pid {child.pid}) did not take {workdir} within "
                       f"{START_DEADLINE_S:.0f} s; see {log_path}")


def stop_controller(workdir: Path, deadline_s: float = STOP_DEADLINE_S) -> ControllerIdentity:
    """SIGTERM to the verified controller of ``workdir`` (it stops at its next round and leaves its
    jobs running); returns once it has let go of the workdir. NoController if none drives it."""
    identity = live_controller(workdir)
    if identity is None:
        raise NoController(f"no controller drives {workdir} now")
    os.kill(identity.pid, signal.SIGTERM)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if live_controller(workdir) is None and _gone(identity):
            return identity
        time.sleep(0.1)
    raise RuntimeError(f"the controller (pid {identity.pid}) still drives {workdir} {deadline_s:.0f} s after "
                       "SIGTERM; it may be waiting on a fault in flight: see controller.log")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
