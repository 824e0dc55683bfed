"""The kill-rank fault: send a signal to one verified rank process."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from injectors.targets import verify_rank


@dataclass(frozen=True)
class FaultOutcome:
    """What the injector did: the time it acted is the fault time of the recovery."""

    kind: str
    rank: int
    pid: int
    node: str
    signal: str
    at: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def signal_number(name: str) -> signal.Signals:
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def kill_rank(run_dir: Path, run_id: str, attempt: int, rank: int, job_id: str, signal_name: str) -> FaultOutcome:
    """Verify rank ``rank`` of the job is the drill's own, then signal it; raises TargetRefused if not."""
    target = verify_rank(run_dir, run_id, attempt, rank, job_id)
    number = signal_number(signal_name)
    at = time.time()
    os.kill(target.pid, number)
    return FaultOutcome(kind="kill-rank", rank=rank, pid=target.pid, node=target.node, signal=number.name, at=at)
