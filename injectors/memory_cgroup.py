"""A memory cap on one process: a child cgroup (v1 memory controller) of the process's own, with a
limit on what it charges from now on. Pages charged before the move stay with the old cgroup
(the kernel no longer moves charges: ``move_charge_at_immigrate`` is gone), so the limit is the
headroom the process gets. The kernel's OOM killer ends the process when it needs more; the
cgroup counts it (``memory.oom_control``: ``oom_kill N``). Root only, on the node of the process.
Where the scheduler already confines the job's memory (Slurm's task/cgroup), its limit is read
instead (``job_memory_limit``: any user may) and no cgroup is made."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from injectors.targets import TargetRefused

MOUNTS = Path("/proc/mounts")
REMOVE_TRIES_S = 5.0


def memory_root() -> Path:
    """Where the v1 memory controller is mounted; TargetRefused if it is not (cgroup v2 only, none)."""
    for line in MOUNTS.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "memory" in parts[3].split(","):
            return Path(parts[1])
    raise TargetRefused("no cgroup v1 memory controller is mounted on this node: oom-rank caps a rank's memory "
                        "with one (cgroup v2 is not supported yet)")


def own_memory_cgroup(pid: int) -> Path:
    """The memory cgroup ``pid`` is in, as a directory of the controller's mount."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return memory_root() / path.lstrip("/")
    raise TargetRefused(f"process {pid} is in no v1 memory cgroup")


def can_cap_memory(pid: int) -> str | None:
    """Why this process may not cap ``pid``'s memory (oom-rank), or None if it may: root and a
    writable cgroup v1 memory controller holding ``pid``."""
    if os.geteuid() != 0:
        return "not root: oom-rank creates a memory cgroup, which only root may"
    try:
        cgroup = own_memory_cgroup(pid)
    except (TargetRefused, OSError) as error:
        return str(error)
    return None if os.access(cgroup, os.W_OK) else f"{cgroup} is not writable"


def machine_memory_bytes() -> int:
    """The node's memory (MemTotal): a cgroup limit at or above it limits nothing."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


@dataclass(frozen=True)
class JobMemoryLimit:
    """The tightest memory limit on a process that a cgroup above it sets (the scheduler's: Slurm's
    task/cgroup limits the job's cgroup and each step's to the job's --mem). Read, never written:
    any user may. The kernel's OOM killer ends a process of the cgroup that outgrows it."""

    directory: Path
    limit_bytes: int
    usage_bytes: int

    @property
    def room_bytes(self) -> int:
        return max(0, self.limit_bytes - self.usage_bytes)

    def peak_bytes(self) -> int | None:
        """The cgroup's peak charge so far; None once the cgroup is gone."""
        try:
            return int((self.directory / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None


def oom_kill_count(directory: Path) -> int | None:
    """The OOM kills a v1 memory cgroup counted (``memory.oom_control``: on the victim's own
    cgroup); None once the cgroup is gone or where the kernel does not count them."""
    try:
        for line in (directory / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def raise_oom_score(pid: int) -> str | None:
    """Make ``pid`` the OOM killer's first choice (``oom_score_adj`` 1000: any user may raise their
    own process's); its value before, to put back, or None if it could not be set."""
    path = Path(f"/proc/{pid}/oom_score_adj")
    try:
        before = path.read_text().strip()
        path.write_text("1000\n")
        return before
    except OSError:
        return None


def restore_oom_score(pid: int, before: str | None) -> None:
    if before is not None:
        try:
            Path(f"/proc/{pid}/oom_score_adj").write_text(f"{before}\n")
        except OSError:
            pass  # it ended, or may no longer lower it: it dies first, as the fault meant


def job_memory_limit(pid: int) -> JobMemoryLimit | None:
    """The limit that leaves ``pid`` the least room, over its memory cgroup and every one above it
    (of equal room, the outermost: the job's, which outlives the rank's step); None where none
    limits below the machine's memory (no scheduler confines the job)."""
    machine = machine_memory_bytes()
    root = memory_root()
    directory = own_memory_cgroup(pid)
    tightest: JobMemoryLimit | None = None
    while directory != root and root in directory.parents:
        try:
            limit = int((directory / "memory.limit_in_bytes").read_text())
            usage = int((directory / "memory.usage_in_bytes").read_text())
        except (OSError, ValueError):
            limit = machine  # a cgroup not readable here limits nothing this process can see
            usage = 0
        if limit < machine:
            found = JobMemoryLimit(directory, limit, usage)
            if tightest is None or found.room_bytes <= tightest.room_bytes:
                tightest = found
        directory = directory.parent
    return tightest


@dataclass
class MemoryCap:
    directory: Path
    parent: Path
    pid: int

    @classmethod
    def create(cls, pid: int, name: str, headroom_bytes: int) -> "MemoryCap":
        parent = own_memory_cgroup(pid)
        directory = parent / name
        try:
            directory.mkdir()
        except OSError as error:
            raise TargetRefused(f"cannot create the memory cgroup {directory}: {error.strerror} (oom-rank needs "
                                "root on the node and a writable cgroup v1 memory controller)") from None
        cap = cls(directory=directory, parent=parent, pid=pid)
        try:
            cap._limit(headroom_bytes)
            (directory / "cgroup.procs").write_text(f"{pid}\n")
        except BaseException:
            cap.remove()
            raise
        return cap

    def _limit(self, limit_bytes: int) -> None:
        (self.directory / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
        set_to = int((self.directory / "memory.limit_in_bytes").read_text())
        if set_to > limit_bytes:
            raise TargetRefused(f"the memory cgroup {self.directory} did not take the limit {limit_bytes} (it says {set_to})")
        swap = self.directory / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no swapping instead of the OOM kill
            swap.write_text(f"{set_to}\n")

    def oom_kills(self) -> int:
        return oom_kill_count(self.directory) or 0

    def peak_bytes(self) -> int:
        return int((self.directory / "memory.max_usage_in_bytes").read_text())

    def remove(self) -> None:
        """Move a process still in it back to its own cgroup, then remove the cgroup (a process that
        just died may hold it a moment)."""
        deadline = time.monotonic() + REMOVE_TRIES_S
        while True:
            try:
                for pid in (self.directory / "cgroup.procs").read_text().split():
                    try:
                        (self.parent / "cgroup.procs").write_text(f"{pid}\n")
                    except ProcessLookupError:
                        continue  # it ended meanwhile
                os.rmdir(self.directory)
                return
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
