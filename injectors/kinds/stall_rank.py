"""stall-rank: SIGSTOP one or more ranks, then SIGCONT after ``duration_s``: a transient straggler.
Shorter than the hang timeout (and the ranks' collective timeout), the run should go on without a
restart; the fault's record says how long the ranks stood still."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.signals import RankFaultOptions, outcome, send, verify_all, wait_until
from injectors.targets import TargetRefused, VerifiedTarget, verify_rank


class StallRankOptions(RankFaultOptions):
    kind: Literal["stall-rank"] = "stall-rank"
    duration_s: float = Field(5.0, gt=0, le=3600, description="how long the ranks stand still")


class StallRank(RankKind):
    name = "stall-rank"
    options = StallRankOptions
    ends_attempt = False

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        wait_until(task.not_before)
        at = send(targets, "SIGSTOP")
        duration = float(task.options["duration_s"])
        time.sleep(duration)
        still = _still_there(task, [t.rank for t in targets])
        resumed = send(still, "SIGCONT")
        gone = len(targets) - len(still)
        detail = f"stopped for {resumed - at:.2f} s, then SIGCONT" + (f" ({gone} had ended meanwhile)" if gone else "")
        return outcome(self.name, targets, "SIGSTOP", at, detail=detail)


def _still_there(task: FaultTask, ranks: list[int]) -> list[VerifiedTarget]:
    """The stopped ranks verified again before SIGCONT (a stopped process ends only by a signal from
    outside, e.g. its job's cancel): a pid reused meanwhile is never sent anything."""
    still = []
    for rank in ranks:
        try:
            still.append(verify_rank(task.run_dir, task.run_id, task.attempt, rank, task.job_id))
        except TargetRefused:
            continue
    return still
