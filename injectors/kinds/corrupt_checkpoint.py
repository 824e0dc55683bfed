"""corrupt-checkpoint: damage one file of a published checkpoint (truncate it, flip bytes in it, or
delete it), as storage does; the next resume must skip it (sizes, sha256) and fall back to the
checkpoint before. Acts from the controller on the run's own directory (shared storage), and only
on a published checkpoint directory of that run."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from experiments.layout import MANIFEST_NAME, RunPaths
from experiments.runtime.checkpoint import CheckpointStore, step_dir_name
from injectors.kinds.base import FaultKind, FaultOptions, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.targets import TargetRefused


class CorruptCheckpointOptions(FaultOptions):
    kind: Literal["corrupt-checkpoint"] = "corrupt-checkpoint"
    mode: Literal["flip", "truncate", "delete"] = "flip"
    step: int | Literal["newest"] = "newest"
    file: str | None = Field(None, description="a file of the checkpoint; default: its largest")


class CorruptCheckpoint(FaultKind):
    name = "corrupt-checkpoint"
    needs_rank_api = "it damages a checkpoint of the store, and a zero-code script keeps its own"
    target = Target.CHECKPOINT
    site = Site.CONTROLLER
    options = CorruptCheckpointOptions
    ends_attempt = False

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        step = options.get("step", "newest")
        return f"checkpoint {step if step == 'newest' else step_dir_name(int(step))} ({options.get('mode', 'flip')})"

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        directory = _checkpoint_dir(task.run_dir, task.options.get("step", "newest"))
        path = _victim(directory, task.options.get("file"))
        mode = str(task.options.get("mode", "flip"))
        at = time.time()
        _damage(path, mode)
        return FaultOutcome(kind=self.name, target=f"checkpoint {directory.name}/{path.name}", at=at, detail=mode)


def _checkpoint_dir(run_dir: Path, step: Any) -> Path:
    """A published checkpoint of this run, verified to lie inside its checkpoint directory."""
    store = CheckpointStore(run_dir)
    published = [path for _, path in store.published()]
    if not published:
        raise TargetRefused(f"{store.root}: no published checkpoint to damage yet")
    chosen = published[0] if step == "newest" else store.step_dir(int(step))
    root = RunPaths(run_dir).checkpoints.resolve()
    if not chosen.is_dir() or chosen.resolve().parent != root or chosen not in published:
        raise TargetRefused(f"{chosen} is not a published checkpoint of this run")
    return chosen


def _own_file(path: Path) -> bool:
    """A regular file with no other name: never a symlink, never a hard link to a file elsewhere
    (shared pretrained weights linked into a checkpoint are not the run's to damage)."""
    info = os.lstat(path)
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def _victim(directory: Path, name: str | None) -> Path:
    files = sorted((p for p in directory.iterdir() if _own_file(p) and p.name != MANIFEST_NAME
                    and not p.name.startswith(".")), key=lambda p: (-p.lstat().st_size, p.name))
    if name is not None:
        files = [p for p in files if p.name == name]
    if not files:
        raise TargetRefused(f"{directory}: no file {name!r} to damage" if name else f"{directory}: no file to damage")
    return files[0]


def _damage(path: Path, mode: str) -> None:
    if mode == "delete":
        path.unlink()
        return
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # a symlink put there since is refused (ELOOP)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise TargetRefused(f"{path} is no longer a file of the checkpoint's own (links: {info.st_nlink})")
    size = info.st_size
    with os.fdopen(fd, "r+b") as handle:
        if mode == "truncate":
            handle.truncate(size // 2)
        else:  # flip: same size, other bytes, so that only the hash can tell
            handle.seek(size // 2)
            byte = handle.read(1)
            handle.seek(size // 2)
            handle.write(bytes([(byte[0] if byte else 0) ^ 0xFF]))
        handle.flush()
        os.fsync(handle.fileno())
