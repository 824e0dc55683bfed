"""kill-rank: a signal to one or more verified rank processes (SIGKILL by default), at one instant."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from injectors.kinds.base import FaultOutcome, FaultTask, RankKind
from injectors.kinds.signals import RankFaultOptions, outcome, send, signal_name, verify_all, wait_until


class KillRankOptions(RankFaultOptions):
    kind: Literal["kill-rank"] = "kill-rank"
    signal: str = "SIGKILL"

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return signal_name(value)


class KillRank(RankKind):
    name = "kill-rank"
    options = KillRankOptions

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return f"{super().describe(ranks, options)} ({options.get('signal', 'SIGKILL')})"

    def act_on_node(self, task: FaultTask) -> FaultOutcome:
        targets = verify_all(task)
        wait_until(task.not_before)
        name = str(task.options.get("signal", "SIGKILL"))
        return outcome(self.name, targets, name, send(targets, name))
