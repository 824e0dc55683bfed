"""oom-rank: a rank runs out of memory, as a leak or a batch too big for the node makes it. The
rank is asked to grow (experiments/runtime/fault_requests: a leak) past a memory limit, and the
kernel's OOM killer ends it. Whose limit (``limit``):

- ``job``: the scheduler's. Where Slurm's task/cgroup confines a job's memory (ConstrainRAMSpace),
  the job's --mem is its memory cgroup's limit: the agent reads it (any user may), makes the rank
  the OOM killer's first choice (oom_score_adj) and asks it to hold more than the limit (its own
  memory alone past it, whatever the page cache holds); Slurm's own OOM handling follows (the step
  OUT_OF_MEMORY). The evidence, a change seen while it grew: its own cgroup's OOM-kill count, or the
  limiting cgroup's peak reaching the limit from below it (a peak already there proves nothing).
- ``agent``: the agent caps the rank's memory with a child memory cgroup of its own (``headroom_mb``
  more than it holds now): root on the node only. The evidence: that cgroup's OOM-kill count.
- ``auto`` (the default): the job's limit where one confines the rank, else the agent's cap.

Either way the attempt's class is OUT_OF_MEMORY. Refused if the rank did not die of it within
``deadline_s`` (a process without Faultdrill's runtime does not grow on request), and where the
job's limit would make the rank grow by more than ``most_mb``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from experiments.runtime.fault_requests import ACTION_LEAK, LEAK_BYTES_PER_S
from injectors.kinds.base import FaultOptions, FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.requests import JobEnding, ask, live_ticks, wait_for_ends
from injectors.kinds.signals import RankFaultOptions, outcome, verify_all
from injectors.memory_cgroup import (
    JobMemoryLimit,
    MemoryCap,
    job_memory_limit,
    node_oom_kill_count,
    oom_kill_count,
    own_memory_cgroup,
    raise_oom_score,
    restore_oom_score,
)
from injectors.targets import TargetRefused, VerifiedTarget, still_in_attempt

MB = 1 << 20


# The limiting cgroup's peak within this of its limit: the rank's charge met the limit (the kernel
# charges in batches of 64 pages; it reclaims what it can before the OOM kill).
PEAK_MARGIN_BYTES = 4 * MB


class OomRankOptions(RankFaultOptions):
    kind: Literal["oom-rank"] = "oom-rank"
    limit: Literal["auto", "job", "agent"] = Field("auto", description=(
        "whose memory limit the rank outgrows: the job's (the scheduler's memory cgroup), the agent's "
        "own cap (root), or auto: the job's where one confines the rank"))
    headroom_mb: int = Field(64, ge=8, le=1024, description="memory the rank may still charge before the OOM kill")
    most_mb: int = Field(4096, ge=64, le=65536, description=(
        "the most the rank is made to grow under the job's limit (a larger --mem is refused)"))
    deadline_s: float = Field(30.0, gt=0, le=600, description="the longest the rank is given to die of it")


class OomRank(RankKind):
    name = "oom-rank"
    needs_rank_api = "the rank grows its memory itself, through the rank API's fault handler"
    needs_root = "it caps the rank's memory with a memory cgroup of its own, which only root may create"
    options = OomRankOptions
    oom_kill_record = True

    def root_needed(self, options: FaultOptions, confines_memory: Callable[[], bool]) -> str | None:
        limit = getattr(options, "limit", "auto")
        if limit == "job" or (limit == "auto" and confines_memory()):
            return None  # the scheduler's cgroup is the cap: reading it needs no privilege
        if limit == "agent":
            return self.needs_root
        return (f"{self.needs_root}, and this site's scheduler does not confine a job's memory (Slurm: task/cgroup "
                "with ConstrainRAMSpace), whose limit the rank would outgrow instead")

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        limit = str(task.options.get("limit", "auto"))
        if limit != "agent":
            try:
                limits = {target.pid: job_memory_limit(target.pid) for target in targets}
            except (FileNotFoundError, ProcessLookupError):
                raise TargetRefused("a rank ended before its job's memory limit was read", gone=True) from None
            except PermissionError as error:  # /proc mounted hidepid, a cgroup file not readable here
                raise TargetRefused(f"the rank's memory cgroup cannot be read here ({error.strerror}: "
                                    f"{error.filename})") from None
            if all(limits.values()):
                return self._past_the_jobs_limit(task, targets)
            if limit == "job":
                [unlimited, *_] = [target for target in targets if limits[target.pid] is None]
                raise TargetRefused(f"rank {unlimited.rank}'s job has no memory limit (no cgroup above "
                                    "it limits below the node's memory): limit: job needs the scheduler to confine "
                                    "the job's memory (Slurm: task/cgroup, ConstrainRAMSpace, and --mem)")
        return self._under_own_cap(task, targets)

    def _past_the_jobs_limit(self, task: FaultTask, targets: list[VerifiedTarget]) -> FaultOutcome:
        """Each rank asked to hold more than its job's memory limit (its own memory alone past it,
        whatever the page cache holds), made the OOM killer's first choice; the evidence a change
        seen while it grew: its cgroup's OOM-kill count, or the limiting cgroup's peak reaching the
        limit from below it."""
        headroom = int(task.options.get("headroom_mb", 64)) * MB
        most = int(task.options.get("most_mb", 4096)) * MB
        ticks = live_ticks(targets)
        ending = JobEnding()
        met = wait_for_moment(task, targets, ending)
        targets = still_in_attempt(targets)
        limits = {target.pid: _job_limit(target) for target in targets}  # read again: the room is now's
        for target in targets:
            if limits[target.pid].limit_bytes > most:
                raise TargetRefused(f"rank {target.rank}'s job memory limit ({limits[target.pid].limit_bytes / MB:.0f} MB) "
                                    f"is more than most_mb {most // MB}: give the job a smaller --mem, or raise most_mb")
        grow_to = max(limit.limit_bytes for limit in limits.values()) + headroom
        watched = {target.pid: _OomWatch.before(target.pid, limits[target.pid]) for target in targets}
        scores = {target.pid: raise_oom_score(target.pid) for target in targets}
        try:
            at, targets = ask(task, targets, {"action": ACTION_LEAK, "most_bytes": grow_to})
            deadline = at + float(task.options.get("deadline_s", 30.0)) + grow_to / LEAK_BYTES_PER_S
            ended = wait_for_ends(targets, ticks, deadline, ending,
                                  on_tick=lambda: _look_all(watched))
        finally:
            for pid, before in scores.items():
                restore_oom_score(pid, before)
        # the node's count tells as many kills as it rose by: each target that only it can tell needs one
        claimants = sum(1 for target in targets if watched[target.pid].direct_evidence() is None
                        and watched[target.pid].node_rise() is not None)
        evidence = {target.pid: watched[target.pid].evidence(max(1, claimants)) for target in targets}
        survivors = [target for target in targets if target.pid not in ended or evidence[target.pid] is None]
        if survivors:
            raise TargetRefused(_why_not_past_limit(survivors[0], ended, watched, task))
        took = max(ended.values()) - at
        first = limits[targets[0].pid]
        return outcome(self.name, targets, "SIGKILL", at, met_step=met, detail=(
            f"the job's memory limit ({first.limit_bytes / MB:.0f} MB, cgroup {first.directory.name}): the rank made "
            f"to grow past it, the kernel's OOM killer ended it {took:.2f} s later ({evidence[targets[0].pid]})"))

    def _under_own_cap(self, task: FaultTask, targets: list[VerifiedTarget]) -> FaultOutcome:
        """Each rank capped by a memory cgroup of the agent's own, then asked to grow (root)."""
        headroom = int(task.options.get("headroom_mb", 64))
        deadline_s = float(task.options.get("deadline_s", 30.0))
        ticks = live_ticks(targets)
        caps: list[MemoryCap] = []
        ending = JobEnding()  # the job ends when the rank dies: finish the record first
        met = wait_for_moment(task, targets, ending)
        # Capped only now, each once it is shown still in its attempt: a warm process that left it
        # (it serves the next one now) must not run on under this fault's cap; the others go on.
        targets = still_in_attempt(targets)
        try:  # every cap made is removed again, whatever happens after it (a later target gone too)
            caps.extend(_cap(task, target, headroom * MB) for target in targets)
            at, targets = ask(task, targets, {"action": ACTION_LEAK})
            asked = {target.pid for target in targets}
            for cap in [cap for cap in caps if cap.pid not in asked]:  # not asked: no cap a moment longer
                caps.remove(cap)
                cap.remove()
            ended = wait_for_ends(targets, ticks, at + deadline_s, ending)
            kills = {cap.pid: cap.oom_kills() for cap in caps}
            peaks = {cap.pid: cap.peak_bytes() for cap in caps}
        finally:
            for cap in caps:
                cap.remove()
        survivors = [t for t in targets if not (t.pid in ended and kills[t.pid] > 0)]
        if survivors:
            raise TargetRefused(_why_not(survivors[0], ended, kills, headroom, deadline_s))
        took = max(ended.values()) - at
        peak = max(peaks.values()) / MB
        return outcome(self.name, targets, "SIGKILL", at, met_step=met, detail=(
            f"memory capped at +{headroom} MB, the rank made to grow: the kernel's OOM killer ended it "
            f"{took:.2f} s later (oom_kill {sum(kills.values())}, peak +{peak:.0f} MB)"))


def _job_limit(target: VerifiedTarget) -> JobMemoryLimit:
    """``target``'s job memory limit now; TargetRefused(gone) if it ended, or if no limit is left."""
    try:
        found = job_memory_limit(target.pid)
    except (FileNotFoundError, ProcessLookupError):
        found = None
    if found is None:
        raise TargetRefused(f"rank {target.rank} (pid {target.pid}) ended before its job's memory limit was read",
                            gone=True)
    return found


@dataclass
class _OomWatch:
    """What tells the OOM killer's kill of one rank from any other end, read as changes: the
    rank's own memory cgroup's kill count (the scheduler removes that cgroup with the step, so it
    is read at every look while the rank lives), the limiting cgroup's peak (a high-water mark:
    evidence only if it was below the limit before the rank grew; the page cache of the rank's
    start-up often took it there) and, where the rank's cgroup went with its step before its count
    was read (a loaded node: cgroup v1 counts a kill on the victim's cgroup only), the node's own
    kill count, which only the kernel's OOM killer moves."""

    own: Path | None
    limit: JobMemoryLimit
    kills_before: int | None
    peak_before: int | None
    kills_seen: int | None = None
    node_kills_before: int | None = None

    @classmethod
    def before(cls, pid: int, limit: JobMemoryLimit) -> "_OomWatch":
        try:
            own: Path | None = own_memory_cgroup(pid)
        except (OSError, TargetRefused):
            own = None
        kills = oom_kill_count(own) if own is not None else None
        return cls(own, limit, kills, limit.peak_bytes(), kills, node_oom_kill_count())

    def look(self) -> None:
        if self.own is not None and (kills := oom_kill_count(self.own)) is not None:
            self.kills_seen = kills

    def evidence(self, node_claimants: int = 1) -> str | None:
        """The change that shows the OOM killer's kill, in words; None if none was seen.
        ``node_claimants``: the targets whose kill only the node's count can tell (each needs one)."""
        if (direct := self.direct_evidence()) is not None:
            return direct
        rise = self.node_rise()
        if rise is not None and rise >= node_claimants:
            return (f"the node's OOM-kill count (/proc/vmstat) rose by {rise} while it grew; its own cgroup went "
                    "with its step before its count was read, the job's cgroup at its limit")
        return None

    def direct_evidence(self) -> str | None:
        """The rank's own cgroup's kill count moved, or the limiting cgroup's peak rose to its limit."""
        self.look()
        if self.kills_before is not None and self.kills_seen is not None and self.kills_seen > self.kills_before:
            return f"its memory cgroup counted oom_kill {self.kills_seen - self.kills_before}"
        peak, near = self.limit.peak_bytes(), self.limit.limit_bytes - PEAK_MARGIN_BYTES
        if peak is not None and self.peak_before is not None and self.peak_before < near <= peak:
            return f"the cgroup's peak went from {self.peak_before / MB:.0f} MB to its limit, {peak / MB:.0f} MB"
        return None

    def node_rise(self) -> int | None:
        """The node's OOM kills since before, where only they can tell this rank's: its own cgroup
        is gone (one still there, its count unmoved, says it was not killed) and the job's peak is
        unknown or at its limit (one below it says the rank never met it). None otherwise."""
        if self.own is not None and oom_kill_count(self.own) is not None:
            return None
        peak = self.limit.peak_bytes()
        if peak is not None and peak < self.limit.limit_bytes - PEAK_MARGIN_BYTES:
            return None
        now = node_oom_kill_count()
        if self.node_kills_before is None or now is None or now <= self.node_kills_before:
            return None
        return now - self.node_kills_before


def _look_all(watched: dict[int, "_OomWatch"]) -> None:
    for watch in watched.values():
        watch.look()


def _why_not_past_limit(target: VerifiedTarget, ended: dict[int, float], watched: dict[int, _OomWatch],
                        task: FaultTask) -> str:
    watch = watched[target.pid]
    limit_mb = watch.limit.limit_bytes / MB
    if target.pid not in ended:
        return (f"rank {target.rank} did not die within {float(task.options.get('deadline_s', 30.0)):g} s (and the "
                f"time its growth takes) of being asked to grow past its job's memory limit ({limit_mb:.0f} MB; a "
                "process without Faultdrill's rank runtime does not grow on request)")
    if watch.peak_before is not None and watch.peak_before >= watch.limit.limit_bytes - PEAK_MARGIN_BYTES:
        return (f"rank {target.rank} ended, but its job's cgroup had peaked at its limit ({limit_mb:.0f} MB) before "
                "and neither its own cgroup's OOM-kill count nor the node's was seen to change: whether the OOM killer "
                "ended it is not known")
    return (f"rank {target.rank} ended, but not at its job's memory limit ({limit_mb:.0f} MB; neither its cgroup's "
            "OOM-kill count, the job's peak nor the node's OOM-kill count changed): not the OOM killer's doing")


def _cap(task: FaultTask, target: VerifiedTarget, headroom_bytes: int) -> MemoryCap:
    """``target``'s memory cap; TargetRefused(gone) if it ended after its verification."""
    try:
        return MemoryCap.create(target.pid, _cgroup_name(task, target), headroom_bytes)
    except (FileNotFoundError, ProcessLookupError):
        raise TargetRefused(f"rank {target.rank} (pid {target.pid}) ended before its memory cap was made",
                            gone=True) from None


def _cgroup_name(task: FaultTask, target: VerifiedTarget) -> str:
    return f"faultdrill-oom-{task.run_id}-a{task.attempt}-r{target.rank}-{target.pid}"


def _why_not(target: VerifiedTarget, ended: dict[int, float], kills: dict[int, int], headroom: int,
             deadline_s: float) -> str:
    if target.pid not in ended:
        return (f"rank {target.rank} did not die within {deadline_s:g} s of a +{headroom} MB memory cap "
                "(a process without Faultdrill's rank runtime does not grow on request)")
    return f"rank {target.rank} ended, but not by the OOM killer (its memory cgroup counted {kills[target.pid]} kills)"
