"""Attempt fencing: only the current attempt of a run may start ranks or write its files.

The controller writes ``<run>/current-attempt`` before it submits an attempt (``"<attempt> -"``) and
again once the scheduler accepted it (``"<attempt> <job id>"``). A job that is not that attempt, or
not that job, is stale: a scheduler's own requeue of a job the controller already replaced, a
duplicate of a submission that timed out, an orphan of a controller that was stopped. A stale
attempt starts no rank, touches no checkpoint and no final record, and says so in its log.

Checked three times: by the batch script before it launches ranks (same file format, read with
``read`` in bash), by every rank before it touches the run's files, and by rank 0 right before it
publishes a checkpoint or the final record (the fence may move while an attempt runs, e.g. when
the controller took it for hung and started the next one).

Plain text, one line, so that a batch script can read it without Python. No file: no controller
claims the run (ranks started by hand, tests), and nothing is fenced.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from experiments.layout import ENV_JOB_ID, RunPaths, fsync_dir

NO_JOB = "-"
FENCE_LOCK = ".current-attempt.lock"
FENCE_LOCK_WAIT_S = 2.0  # a writer never waits longer on another (see _lock_or_give_up)


class StaleAttemptError(RuntimeError):
    """This attempt (or this job) is no longer the run's current one: it must not go on."""


@dataclass(frozen=True)
class Fence:
    attempt: int
    job_id: str | None  # None until the scheduler accepted the attempt
    # The drill whose attempt it is: a job of an earlier drill in the same run directory (its
    # workdir archived, the path reused) is refused whatever its attempt. None: any drill's.
    drill_id: str | None = None

    def admits(self, attempt: int, job_id: str | None, drill_id: str | None = None) -> bool:
        if attempt != self.attempt or (self.drill_id and drill_id and drill_id != self.drill_id):
            return False
        return self.job_id is None or job_id is None or same_job(self.job_id, job_id)

    def render(self) -> str:
        drill = f" {self.drill_id}" if self.drill_id else ""
        return f"{self.attempt} {self.job_id or NO_JOB}{drill}\n"


def same_job(recorded: str, own: str) -> bool:
    """Slurm ids may carry their cluster (``123;cluster``, as ``sbatch --parsable`` prints them)."""
    return recorded.split(";")[0] == own.split(";")[0]


def read_fence(paths: RunPaths) -> Fence | None:
    try:
        text = paths.current_attempt.read_text()
    except FileNotFoundError:
        return None
    parts = text.split()
    if len(parts) not in (2, 3) or not parts[0].isdigit():
        raise StaleAttemptError(f"{paths.current_attempt} holds {text!r}, not '<attempt> <job id> [<drill id>]': "
                                "refusing to run")
    return Fence(int(parts[0]), None if parts[1] == NO_JOB else parts[1], parts[2] if len(parts) == 3 else None)


def write_fence(paths: RunPaths, fence: Fence, durable: bool = True) -> None:
    """Atomically (temporary name, fsync, rename): a reader sees the old line or the new one.
    ``durable`` False: no fsync here; the caller makes a batch of fences durable at once
    (``sync_filesystem``) before anything depends on them."""
    try:
        with _writers_lock(paths):
            _replace(paths, fence, durable)
    except FileNotFoundError:  # the run's directory is not there yet (made only then: a sweep's
        paths.current_attempt.parent.mkdir(parents=True, exist_ok=True)  # 10,000 fences, no mkdir each)
        with _writers_lock(paths):
            _replace(paths, fence, durable)


def advance_fence(paths: RunPaths, held: Fence, new: Fence) -> None:
    """``new`` over ``held`` only: a warm job's coordinator moves its run to the next attempt only
    while the fence still names the attempt it holds. One the controller moved on (the job was
    taken for hung and replaced, or cancelled) is left as it is: StaleAttemptError, and the job
    ends instead of fencing out the controller's."""
    def refuse(current: Fence | None) -> bool:
        if current is None or not current.admits(held.attempt, held.job_id, held.drill_id):
            raise StaleAttemptError(f"{paths.current_attempt} names {current.render().strip() if current else 'nothing'}, "
                                    f"not attempt {held.attempt} of job {held.job_id}: this job is not the run's")
        return False
    _replace_unless(paths, new, refuse)


def write_fence_unless_ahead(paths: RunPaths, fence: Fence, durable: bool = True) -> None:
    """``fence``, unless the fence already names a later attempt of the same job and drill (a warm
    job's coordinator numbers its re-formations itself, and may have moved on while no controller
    ran): a restarted controller never fences a job's running attempt out. ``durable`` False: the
    caller makes a batch of them durable at once (sync_filesystem)."""
    _replace_unless(paths, fence, lambda current: (
        current is not None and current.attempt > fence.attempt and current.drill_id == fence.drill_id
        and current.job_id is not None and fence.job_id is not None and same_job(current.job_id, fence.job_id)),
        durable)


def fence_unless_moved_on(paths: RunPaths, failed: Fence, fence: Fence) -> bool:
    """``fence`` (the next attempt, in a new job), unless the fence already names a later attempt
    of ``failed``'s job: a warm job's coordinator re-formed it while no controller ran, and the
    run goes on there. False when it did (nothing written)."""
    def moved_on(current: Fence | None) -> bool:
        return (current is not None and current.attempt > failed.attempt and current.job_id is not None
                and failed.job_id is not None and same_job(current.job_id, failed.job_id)
                and current.drill_id == failed.drill_id)
    return _replace_unless(paths, fence, moved_on)


def _replace_unless(paths: RunPaths, fence: Fence, keep: Callable[[Fence | None], bool], durable: bool = True) -> bool:
    """Compare, then set, under the writers' lock: ``fence`` unless ``keep`` says the current one
    stays. Whether it was written."""
    with _writers_lock(paths):
        if keep(read_fence(paths)):
            return False
        _replace(paths, fence, durable)
        return True


@contextmanager
def _writers_lock(paths: RunPaths) -> Iterator[None]:
    """The fence's writers one at a time (an advisory lock beside it: the controller's writes and a
    warm coordinator's compare-and-set). A filesystem without locks (some NFS mounts) gives none:
    the writes stay atomic, the comparison is then only as fresh as its read."""
    fd = os.open(paths.root / FENCE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _lock_or_give_up(fd)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _lock_or_give_up(fd: int, deadline_s: float = FENCE_LOCK_WAIT_S) -> None:
    """The lock within ``deadline_s``, else none: its holder is a warm coordinator that the
    scheduler suspended (or whose node died) in the middle of its compare-and-set, which must not
    hold up the controller's loop; the write stays atomic."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > end:
                return
            time.sleep(0.01)
        except OSError:  # no locks on this file system
            return


def _replace(paths: RunPaths, fence: Fence, durable: bool) -> None:
    target = paths.current_attempt
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, fence.render().encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    if durable:
        fsync_dir(target.parent)


def sync_filesystem(path: Path) -> None:
    """Every write made so far to ``path``'s file system durable, in one call (Linux syncfs: one
    journal commit for a batch of files, where an fsync each costs one per file and directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _LIBC.syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs of {path}: {os.strerror(error)}")
    finally:
        os.close(fd)


_LIBC = ctypes.CDLL(None, use_errno=True)


def own_job_id(scheduler_job_id: str) -> str:
    """This process's job as the controller names it (the batch script exports it), else the
    scheduler's id as the rank runtime reads it."""
    return os.environ.get(ENV_JOB_ID) or scheduler_job_id


def check_current(paths: RunPaths, attempt: int, job_id: str | None, doing: str, drill_id: str | None = None) -> None:
    """Raise StaleAttemptError unless ``attempt`` (of ``job_id``, of drill ``drill_id``) is the run's
    current attempt. A drill's rank (``drill_id`` given) needs a fence: a run directory without one
    names no attempt of any drill (the controller writes it before it submits anything)."""
    fence = read_fence(paths)
    if fence is None and not drill_id:
        return
    if fence is None:
        raise StaleAttemptError(f"faultdrill: stale attempt: {paths.root} names no attempt (no fence): attempt "
                                f"{attempt} (job {job_id or '?'}) of drill {drill_id} is not its: {doing} refused")
    if fence.admits(attempt, job_id, drill_id or None):
        return
    current = (f"attempt {fence.attempt}" + (f" (job {fence.job_id})" if fence.job_id else "")
               + (f" of drill {fence.drill_id}" if fence.drill_id else ""))
    raise StaleAttemptError(
        f"faultdrill: stale attempt: attempt {attempt} (job {job_id or '?'}) of drill {drill_id or '?'} of "
        f"{paths.root} is not the run's current one, {current}: {doing} refused"
    )
