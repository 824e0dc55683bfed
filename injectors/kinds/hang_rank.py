"""hang-rank: SIGSTOP one or more ranks. To the scheduler the job runs on; it makes no progress, so
only the ranks' heartbeats show it (the controller's hang timeout)."""

from __future__ import annotations

from typing import Literal

from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.signals import RankFaultOptions, outcome, send, verify_all


class HangRankOptions(RankFaultOptions):
    kind: Literal["hang-rank"] = "hang-rank"


class HangRank(RankKind):
    name = "hang-rank"
    options = HangRankOptions
    stops_target = True

    def halts_target(self, signal_name: str) -> bool:
        return True

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        met = wait_for_moment(task, targets)
        return outcome(self.name, targets, "SIGSTOP", send(targets, "SIGSTOP"), met_step=met)
