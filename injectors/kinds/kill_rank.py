"""kill-rank: a signal to one or more verified rank processes (SIGKILL by default), at one instant.

``process: launcher`` aims at the launcher that started the ranks on their node instead (torchrun's
agent: its workers are the ranks), once per launcher: what a kill of torchrun does to its workers."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator

from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.moment import wait_for_moment
from injectors.kinds.signals import RankFaultOptions, outcome, send, signal_name, verify_all
from injectors.targets import VerifiedTarget, verify_launcher


class KillRankOptions(RankFaultOptions):
    kind: Literal["kill-rank"] = "kill-rank"
    signal: str = "SIGKILL"
    process: Literal["rank", "launcher"] = Field(
        "rank", description="the rank itself, or the launcher that started it on its node (torchrun)")

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return signal_name(value)


class KillRank(RankKind):
    name = "kill-rank"
    options = KillRankOptions

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return f"{super().describe(ranks, options)} ({options.get('signal', 'SIGKILL')})"

    def halts_target(self, signal_name: str) -> bool:
        return signal_name == "SIGKILL"  # another signal may be caught (a handler may checkpoint and go on)

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        launcher = task.options.get("process") == "launcher"
        targets = _launchers(task) if launcher else verify_all(task)
        met = wait_for_moment(task, targets)
        name = str(task.options.get("signal", "SIGKILL"))
        detail = f"the launcher (pid {targets[0].pid}) of the ranks" if launcher and targets else ""
        return outcome(self.name, targets, name, send(targets, name), detail=detail, met_step=met)


def _launchers(task: FaultTask) -> list[VerifiedTarget]:
    """The launchers of the task's ranks, each verified once (one torchrun starts several ranks)."""
    found: dict[int, VerifiedTarget] = {}
    for rank in task.ranks:
        target = verify_launcher(task.run_dir, task.run_id, task.attempt, rank, task.job_id)
        if target.pid in found:
            if target.pidfd is not None:
                os.close(target.pidfd)
            continue
        found[target.pid] = target
    return list(found.values())
