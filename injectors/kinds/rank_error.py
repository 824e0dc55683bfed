"""rank-error: a rank raises an exception in its training loop, as a bug, a NaN guard or a device
error makes it: a Python traceback, exit code 1, the error in the rank's error record, its peers
losing it. The agent asks the rank (experiments/runtime/fault_requests); the rank raises at once,
in its main thread, wherever its training is (a step, a checkpoint). The class is RANK_EXIT.
Refused if the rank did not end within ``deadline_s`` (a process without Faultdrill's runtime
ignores the request)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from experiments.runtime.fault_requests import ACTION_RAISE
from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.requests import JobEnding, ask, live_ticks, wait_for_ends
from injectors.kinds.signals import RankFaultOptions, outcome, verify_all
from injectors.targets import TargetRefused

DEFAULT_MESSAGE = "raised in the training loop by the rank-error fault"


class RankErrorOptions(RankFaultOptions):
    kind: Literal["rank-error"] = "rank-error"
    message: str = Field(DEFAULT_MESSAGE, min_length=1, max_length=500, description="what the exception says")
    deadline_s: float = Field(30.0, gt=0, le=600, description="the longest the rank is given to end of it")


class RankError(RankKind):
    name = "rank-error"
    needs_rank_api = "the rank raises the error itself, through the rank API's fault handler"
    options = RankErrorOptions

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        message = str(task.options.get("message", DEFAULT_MESSAGE))
        deadline_s = float(task.options.get("deadline_s", 30.0))
        ticks = live_ticks(targets)
        ending = JobEnding()
        met = wait_for_moment(task, targets, ending)
        at, targets = ask(task, targets, {"action": ACTION_RAISE, "message": message})
        ended = wait_for_ends(targets, ticks, at + deadline_s, ending)
        if len(ended) < len(targets):
            alive = [t.rank for t in targets if t.pid not in ended]
            raise TargetRefused(f"rank {alive[0]} did not end within {deadline_s:g} s of the request to raise "
                                "(a process without Faultdrill's rank runtime ignores it)")
        took = max(ended.values()) - at
        return outcome(self.name, targets, "", at, met_step=met,
                       detail=f"raised InjectedRankError({message!r}); the rank ended {took:.2f} s later")

