"""disk-full: the filesystem of the run's checkpoint directory fills up, so that the next
checkpoint write hits ENOSPC. Expected: the failed write leaves no partial checkpoint visible, the
previous valid one is intact, the rank exits naming the error, and the ledger records it.

The fault fills the filesystem with a ballast file in the run's own checkpoint directory, leaving
``leave_mb`` free, and removes it once the job it hit has ended (at most ``duration_s``). It
refuses a filesystem with more than ``max_fill_mb`` free: it is meant for a small filesystem
mounted for the run's checkpoint directory (``scripts/cluster small-fs``, a tmpfs), never for a
shared disk that other work lives on."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from experiments.layout import RunPaths
from injectors.kinds.base import FaultKind, FaultOptions, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.kinds.scheduler_end import wait_for_job_end
from injectors.targets import TargetRefused

MB = 1024 * 1024
BALLAST_PREFIX = "faultdrill-ballast-"  # not a step directory's name: the store never reads it


class DiskFullOptions(FaultOptions):
    kind: Literal["disk-full"] = "disk-full"
    leave_mb: float = Field(0.5, ge=0, le=1024, description="space left free (less than one checkpoint)")
    max_fill_mb: float = Field(1024.0, gt=0, le=65536, description="refuse a filesystem with more free space")
    duration_s: float = Field(60.0, gt=0, le=3600, description="the longest the disk stays full")


class DiskFull(FaultKind):
    name = "disk-full"
    needs_rank_api = "it fills the store's checkpoint directory, and a zero-code script writes its own"
    target = Target.CHECKPOINT
    site = Site.CONTROLLER
    options = DiskFullOptions

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return f"checkpoint filesystem (full, {float(options.get('leave_mb', 0.5)):g} MB left)"

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        control.verify_running()
        directory = RunPaths(task.run_dir).checkpoints
        free = _free_bytes(directory)
        problem = too_big(directory, free, float(task.options.get("max_fill_mb", 1024.0)))
        if problem is not None:  # asked at plan too; the filesystem may have changed since
            raise TargetRefused(f"{problem}; nothing was written")
        ballast = directory / f"{BALLAST_PREFIX}{uuid.uuid4().hex[:8]}"
        control.owe_removal(ballast)  # before the file: a controller killed while it is there leaves it owed
        at = time.time()
        filled = _fill(ballast, free - int(float(task.options.get("leave_mb", 0.5)) * MB))
        try:
            # Checked often: the ballast must be gone before the next attempt writes a checkpoint.
            wait_for_job_end(control, float(task.options.get("duration_s", 60.0)), every_s=1.0)
            held = time.time() - at
        finally:
            ballast.unlink(missing_ok=True)
        return FaultOutcome(kind=self.name, target=f"checkpoint filesystem of {directory.name}/", at=at, detail=(
            f"filled {filled / MB:.1f} MB ({_free_bytes(directory) / MB:.1f} MB free once removed); "
            f"full for {held:.1f} s"))


def too_big(directory: Path, free: int, max_fill_mb: float) -> str | None:
    """Why disk-full will not fill ``directory``'s filesystem (``free`` bytes free), if it will not."""
    if free <= max_fill_mb * MB:
        return None
    return (f"{directory} is on a filesystem with {free / MB:.0f} MB free, more than max_fill_mb ({max_fill_mb:g}): "
            "disk-full fills only a small filesystem meant for the run's checkpoints: a checkpoint.directory on a "
            "small filesystem, or under a directory (project) quota that statfs reports as the free space (XFS, "
            "ext4); a user or group quota does not show there and is not used (on the project's cluster: "
            "scripts/cluster small-fs). Never raise max_fill_mb to fill a disk other work lives on")


def fill_problem(directory: Path, max_fill_mb: float) -> str | None:
    """At plan: why disk-full cannot fill the filesystem ``directory`` (or its nearest existing
    parent: the checkpoint directory is made when the drill starts) will be on, if it cannot."""
    existing = next((parent for parent in (directory, *directory.parents) if parent.exists()), Path("/"))
    try:
        return too_big(existing, _free_bytes(existing), max_fill_mb)
    except TargetRefused as error:
        return str(error)


def _free_bytes(directory: Path) -> int:
    try:
        stats = os.statvfs(directory)
    except OSError as error:
        raise TargetRefused(f"{directory}: {error}") from None
    return stats.f_bavail * stats.f_frsize


def _fill(path: Path, size: int) -> int:
    """A file of ``size`` bytes, its blocks allocated (not sparse); what it could take."""
    if size <= 0:
        path.touch()
        return 0
    with open(path, "wb") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, size)
        except OSError:  # a filesystem without fallocate: write zeros until it is full
            _write_until_full(handle, size)
    return path.stat().st_size


def _write_until_full(handle: Any, size: int) -> None:
    chunk = b"\0" * MB
    written = 0
    try:
        while written < size:
            written += handle.write(chunk[: min(MB, size - written)])
        handle.flush()
        os.fsync(handle.fileno())
    except OSError:  # full before ``size``: as full as it gets
        pass
