"""stall-rank: SIGSTOP one or more ranks, then SIGCONT after ``duration_s``: a transient straggler.
Shorter than the hang timeout (and the ranks' collective timeout), the run should go on without a
restart; the fault's record says how long the ranks stood still."""

from __future__ import annotations

import signal
import time
from typing import Literal

from pydantic import Field

from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.signals import RankFaultOptions, outcome, send_to, verify_all
from injectors.targets import VerifiedTarget, signal_target


class StallRankOptions(RankFaultOptions):
    kind: Literal["stall-rank"] = "stall-rank"
    duration_s: float = Field(5.0, gt=0, le=3600, description="how long the ranks stand still")


class StallRank(RankKind):
    name = "stall-rank"
    options = StallRankOptions
    ends_attempt = False

    def halts_target(self, signal_name: str) -> bool:
        return True  # while it stands still: its record says for how long (orchestrator/record/effects.py)

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        met = wait_for_moment(task, targets)
        at, targets = send_to(targets, "SIGSTOP")  # only the ones stopped are continued, and recorded
        duration = float(task.options["duration_s"])
        time.sleep(duration)
        resumed, gone = _resume(targets)
        detail = f"stopped for {resumed - at:.2f} s, then SIGCONT" + (f" ({gone} had ended meanwhile)" if gone else "")
        return outcome(self.name, targets, "SIGSTOP", at, detail=detail, met_step=met)


def _resume(targets: list[VerifiedTarget]) -> tuple[float, int]:
    """SIGCONT to the very processes that were stopped (their pidfd, or their start time checked
    again: a pid reused meanwhile is never sent anything), whatever their registration says since
    (a warm process that left its attempt just before the stop must go on); when, and how many had
    ended (a stopped process ends only by a signal from outside, e.g. its job's cancel)."""
    at, ended = time.time(), 0
    for target in targets:
        try:
            signal_target(target, signal.SIGCONT)
        except ProcessLookupError:
            ended += 1
    return at, ended
