"""Memory cgroups, for oom-rank. Where the scheduler confines the job's memory (Slurm's task/cgroup
with ConstrainRAMSpace), its limit is read (``job_memory_limit``: any user may, on cgroup v1 or
v2) and no cgroup is made: the rank is asked to outgrow it. Elsewhere, as root on cgroup v1 only,
a memory cap on one process: a child cgroup of the process's own, with a limit on what it charges
from now on. Pages charged before the move stay with the old cgroup (the kernel no longer moves
charges: ``move_charge_at_immigrate`` is gone), so the limit is the headroom the process gets.
The kernel's OOM killer ends the process when it needs more; the cgroup counts it (v1:
``memory.oom_control``, v2: ``memory.events``, each ``oom_kill N``).

A cgroup directory is v1's or v2's, never both, so each reading below takes whichever of the two
files the directory has (v1 name first): the limit (``memory.limit_in_bytes`` / ``memory.max``,
"max" for none), the charge (``memory.usage_in_bytes`` / ``memory.current``), the peak
(``memory.max_usage_in_bytes`` / ``memory.peak``, Linux 5.19+; without it the kill count is
the only evidence) and the kill count."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from injectors.targets import TargetRefused

MOUNTS = Path("/proc/mounts")
PROC = Path("/proc")
REMOVE_TRIES_S = 5.0
LIMIT_FILES = ("memory.limit_in_bytes", "memory.max")
USAGE_FILES = ("memory.usage_in_bytes", "memory.current")
PEAK_FILES = ("memory.max_usage_in_bytes", "memory.peak")
KILL_FILES = ("memory.oom_control", "memory.events")


@dataclass(frozen=True)
class MemoryController:
    """Where this node's memory controller is mounted, and which cgroup version it is."""

    root: Path
    version: int  # 1 or 2


def memory_controller() -> MemoryController:
    """The node's memory controller: v1's mount if there is one (a hybrid node's unified hierarchy
    then has no memory controller), else the cgroup2 mount that offers ``memory``; TargetRefused
    where neither does."""
    unified: Path | None = None
    for line in MOUNTS.read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup" and "memory" in parts[3].split(","):
            return MemoryController(Path(parts[1]), 1)
        if parts[2] == "cgroup2" and unified is None:
            unified = Path(parts[1])
    if unified is not None and "memory" in _words(unified / "cgroup.controllers"):
        return MemoryController(unified, 2)
    raise TargetRefused("no memory controller is mounted on this node (neither a cgroup v1 memory hierarchy nor a "
                        "cgroup2 mount offering memory): oom-rank reads or sets a memory cgroup")


def memory_root() -> Path:
    """Where the v1 memory controller is mounted (the agent's own cap needs v1); TargetRefused
    where the node has none."""
    found = memory_controller()
    if found.version != 1:
        raise TargetRefused(f"this node's memory controller is cgroup v2 ({found.root}): limit: agent (a cap of the "
                            "agent's own) needs cgroup v1; use limit: job under the scheduler's own memory limit")
    return found.root


def own_memory_cgroup(pid: int) -> Path:
    """The memory cgroup ``pid`` is in, as a directory of the controller's mount."""
    controller = memory_controller()
    for line in (PROC / str(pid) / "cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        v1_memory = "memory" in controllers.split(",")
        if (controller.version == 1 and v1_memory) or (controller.version == 2 and hierarchy == "0" and not controllers):
            return controller.root / path.lstrip("/")
    raise TargetRefused(f"process {pid} is in no cgroup v{controller.version} memory cgroup")


def can_cap_memory(pid: int) -> str | None:
    """Why this process may not cap ``pid``'s memory (oom-rank), or None if it may: root and a
    writable cgroup v1 memory controller holding ``pid``."""
    if os.geteuid() != 0:
        return "not root: oom-rank creates a memory cgroup, which only root may"
    try:
        memory_root()
        cgroup = own_memory_cgroup(pid)
    except (TargetRefused, OSError) as error:
        return str(error)
    return None if os.access(cgroup, os.W_OK) else f"{cgroup} is not writable"


def machine_memory_bytes() -> int:
    """The node's memory (MemTotal): a cgroup limit at or above it limits nothing."""
    for line in (PROC / "meminfo").read_text().splitlines():
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
        """The cgroup's peak charge so far; None once the cgroup is gone, or where the kernel keeps
        no peak (cgroup v2 before Linux 5.19)."""
        try:
            return int(_read_first(self.directory, PEAK_FILES))
        except (OSError, ValueError):
            return None


def oom_kill_count(directory: Path) -> int | None:
    """The OOM kills a memory cgroup counted (``oom_kill N`` in v1's ``memory.oom_control``, on the
    victim's own cgroup, or v2's ``memory.events``, which counts its descendants' too); None once
    the cgroup is gone or where the kernel does not count them."""
    try:
        for line in _read_first(directory, KILL_FILES).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def node_oom_kill_count() -> int | None:
    """The OOM kills the node's kernel made since boot (``oom_kill`` in ``/proc/vmstat``, Linux
    4.13+; any user may read it): evidence that outlives the victim's cgroup, which the scheduler
    removes with its step. None where the kernel does not count them."""
    try:
        with open(PROC / "vmstat", encoding="ascii") as vmstat:
            for line in vmstat:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _read_first(directory: Path, names: tuple[str, ...]) -> str:
    """The first of ``names`` (v1's, then v2's) that ``directory`` has; FileNotFoundError if none."""
    for name in names:
        try:
            return (directory / name).read_text()
        except FileNotFoundError:
            continue
    raise FileNotFoundError(errno.ENOENT, "no memory file", str(directory / names[-1]))


def _limit_bytes(directory: Path, machine: int) -> int:
    """The cgroup's memory limit; ``machine`` for none (v2's "max")."""
    text = _read_first(directory, LIMIT_FILES).strip()
    return machine if text == "max" else int(text)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


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
    root = memory_controller().root
    directory = own_memory_cgroup(pid)
    tightest: JobMemoryLimit | None = None
    while directory != root and root in directory.parents:
        try:
            limit = _limit_bytes(directory, machine)
            usage = int(_read_first(directory, USAGE_FILES))
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
        memory_root()  # the cap is v1's: on a cgroup v2 node, refused naming limit: job
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
