"""One controller per workdir, and drills that outlive the terminal they were started from.

The controller holds an exclusive lock on ``<workdir>/controller.lock`` while it drives the drill
and names itself in ``controller.json`` (pid, the kernel's start time of that pid, the command):
a second controller on the same workdir is refused, and ``stop``/``cancel`` signal only a process
that is that controller — the pid alive, with the same start time, and the lock held.
``drill --detach`` starts the same ``drill`` command in a new session, its output in
``controller.log``, and returns once the child holds the lock.

Several login nodes share the workdir on a network filesystem, where a pid means nothing on
another host and a lock may be the node's own (NFS with ``local_lock``, Lustre ``localflock``).
So ``controller.json`` names the host, and the controller renews the lock file's modification
time every RENEW_S: from another host, a controller is live when that time moves while one
watches (LEASE_S; a change, never a comparison of two machines' clocks). ``status`` there says
where it runs, ``stop`` and ``cancel`` name the host to run them on, and a second controller is
refused even where the lock did not stop it. A filesystem with no locks at all (Lustre mounted
``noflock``: ENOSYS) is a clear error naming the workdir, before anything is submitted.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Callable

from experiments.runtime.identity import start_ticks

LOCK_NAME = "controller.lock"
IDENTITY_NAME = "controller.json"
LOG_NAME = "controller.log"
EXIT_NAME = "controller-exit.json"
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 120.0  # a fault in flight is let finish (it may owe a node's restore)
RENEW_S = 1.0  # the controller touches its lock file this often
LEASE_S = 3.5  # another host's controller is live if its lock file's time moved within this long
# flock's errors on a filesystem that has no locks (Lustre noflock: ENOSYS; NFS nolock: ENOLCK)
NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


class ControllerBusy(RuntimeError):
    """Another controller drives this workdir."""


class ControllerElsewhere(ControllerBusy):
    """The live controller of this workdir runs on another host: only there can it be signalled."""


class NoController(RuntimeError):
    """No live controller drives this workdir."""


@dataclass(frozen=True)
class ControllerIdentity:
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells a reused pid from ours
    started: float
    argv: list[str]
    host: str = ""  # where it runs ("": written before hosts were recorded, taken for this one)

    @property
    def elsewhere(self) -> bool:
        return bool(self.host) and self.host != socket.gethostname()

    @property
    def host_name(self) -> str:
        return self.host or socket.gethostname()

    def where(self) -> str:
        return f"pid {self.pid} on {self.host_name}"


def _gone(identity: ControllerIdentity) -> bool:
    return start_ticks(identity.pid) != identity.start_ticks


class ControllerLock:
    """Held for the life of one controller; ``with ControllerLock(workdir):``."""

    def __init__(self, workdir: Path, on_lost: Callable[[ControllerIdentity], None] | None = None) -> None:
        self.workdir = workdir
        self._handle: IO[str] | None = None
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None
        self.identity: ControllerIdentity | None = None
        # Another controller took the workdir (this one was paused past its lease): stop this one.
        self.on_lost = on_lost or _stop_this_controller

    def __enter__(self) -> "ControllerLock":
        self.workdir.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(os.open(self.workdir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+")
        try:
            _take(handle, self.workdir)
            _refuse_a_live_one_elsewhere(self.workdir)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        pid = os.getpid()
        self.identity = ControllerIdentity(pid, start_ticks(pid) or 0, time.time(), sys.argv, socket.gethostname())
        _write_json(self.workdir / IDENTITY_NAME, asdict(self.identity))
        (self.workdir / EXIT_NAME).unlink(missing_ok=True)
        self._renewer = threading.Thread(target=self._renew, args=(handle.fileno(),), name="controller-lease",
                                         daemon=True)
        self._renewer.start()
        return self

    def _renew(self, fd: int) -> None:
        """The lock file's time moves while this controller lives (seen from other hosts), through
        the file it holds; and this controller stops once the workdir names another one (it was
        paused, or starved, past its lease, and a controller elsewhere took over)."""
        while not self._stop_renewing.wait(RENEW_S):
            holder = read_identity(self.workdir)
            if holder is not None and holder != self.identity:
                self.on_lost(holder)
                return
            try:
                stamp = time.time_ns()
                os.utime(fd, ns=(stamp, stamp))
            except OSError:
                pass  # a moment the filesystem refused: the next renewal counts

    def __exit__(self, *exc: object) -> None:
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join(timeout=RENEW_S * 2)
        if self.identity is not None and read_identity(self.workdir) == self.identity:
            (self.workdir / IDENTITY_NAME).unlink(missing_ok=True)  # never a successor's
        if self._handle is not None:
            self._handle.close()  # releases the lock
            self._handle = None


def _stop_this_controller(successor: ControllerIdentity) -> None:
    print(f"faultdrill: the workdir now names another controller ({successor.where()}): this one was paused past its "
          "lease and stops at its next round, leaving the jobs to that one", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # the stop that `faultdrill stop` asks for


def _take(handle: IO[str], workdir: Path) -> None:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_identity(workdir)
        who = f"{holder.where()}, started {time.ctime(holder.started)}" if holder else "another process"
        raise ControllerBusy(
            f"a controller ({who}) already drives {workdir}; wait for it, see it with "
            f"`faultdrill status {workdir}`, or stop it with `faultdrill stop {workdir}`") from None
    except OSError as error:
        if error.errno not in NO_LOCKS:
            raise
        raise ControllerBusy(
            f"{workdir}: its filesystem gives no file locks ({os.strerror(error.errno or 0)}; Lustre mounted "
            "noflock, NFS mounted nolock): one controller per workdir cannot be ensured there. Give the "
            "spec a `workdir` on a filesystem with locks (a local disk, or Lustre with flock)") from None


def _refuse_a_live_one_elsewhere(workdir: Path) -> None:
    """A lock taken here says nothing of a controller on another host where locks are the node's
    own: one that renews its lock file drives the workdir still."""
    holder = read_identity(workdir)
    if holder is not None and holder.elsewhere and lease_moves(workdir):
        raise ControllerElsewhere(
            f"a controller ({holder.where()}, started {time.ctime(holder.started)}) drives {workdir}, and this "
            f"filesystem's locks do not reach across hosts; wait for it, or run `faultdrill stop {workdir}` on "
            f"{holder.host}")


def lease_moves(workdir: Path) -> bool:
    """True when the lock file's modification time changes within LEASE_S: its controller,
    wherever it runs, is alive. Each look opens the file again: NFS checks its
    attributes on open."""
    first = _lock_mtime(workdir)
    if first is None:
        return False
    end = time.monotonic() + LEASE_S
    while time.monotonic() < end:
        time.sleep(0.1)
        if _lock_mtime(workdir) != first:
            return True
    return False


def _lock_mtime(workdir: Path) -> int | None:
    try:
        with open(workdir / LOCK_NAME, "rb") as handle:
            return os.fstat(handle.fileno()).st_mtime_ns
    except OSError:
        return None


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
    """The controller driving ``workdir``, verified: on this host, its lock is held and its pid alive
    with the start time it recorded; on another, its lock file renewed while watched. None when
    there is none (a stale identity file is not one)."""
    identity = read_identity(workdir)
    if identity is None:
        return None
    if identity.elsewhere:
        return identity if lease_moves(workdir) else None
    if start_ticks(identity.pid) != identity.start_ticks or not _lock_held(workdir):
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
    if identity.elsewhere:
        raise ControllerElsewhere(f"the controller of {workdir} runs on another host ({identity.where()}): "
                                  f"run this command on {identity.host}")
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
