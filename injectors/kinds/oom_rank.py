"""oom-rank: a rank runs out of memory, as a leak or a batch too big for the node makes it. The
agent caps the rank's memory (a child memory cgroup of its own, ``headroom_mb`` more than it holds
now) and asks it to grow (experiments/runtime/fault_requests: a leak); the kernel's OOM killer
ends it, as it does on a node whose job outgrows its memory (Slurm's task/cgroup, PBS's mem
limit). The agent waits for the rank's end, reads the cgroup's OOM-kill count (the evidence: the
attempt's class is OUT_OF_MEMORY) and removes the cgroup. Refused without a cgroup v1 memory
controller the agent may write (root on the node), and if the rank did not die of it within
``deadline_s`` (a process without Faultdrill's runtime does not grow on request)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from experiments.runtime.fault_requests import ACTION_LEAK
from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.requests import JobEnding, ask, live_ticks, wait_for_ends
from injectors.kinds.signals import RankFaultOptions, outcome, verify_all
from injectors.memory_cgroup import MemoryCap
from injectors.targets import TargetRefused, VerifiedTarget, still_in_attempt

MB = 1 << 20


class OomRankOptions(RankFaultOptions):
    kind: Literal["oom-rank"] = "oom-rank"
    headroom_mb: int = Field(64, ge=8, le=1024, description="memory the rank may still charge before the OOM kill")
    deadline_s: float = Field(30.0, gt=0, le=600, description="the longest the rank is given to die of it")


class OomRank(RankKind):
    name = "oom-rank"
    needs_rank_api = "the rank grows its memory itself, through the rank API's fault handler"
    needs_root = "it caps the rank's memory with a memory cgroup of its own, which only root may create"
    options = OomRankOptions
    oom_kill_record = True

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
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
