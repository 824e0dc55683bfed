"""Signalling verified rank processes: the part kill-rank, hang-rank and stall-rank share."""

from __future__ import annotations

import signal
import time

from injectors.kinds.base import FaultOptions, FaultOutcome, FaultTask
from injectors.ranks import RankSelector
from injectors.targets import TargetRefused, VerifiedTarget, signal_target, verify_rank

SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGSEGV", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT")


def signal_name(value: str) -> str:
    """``TERM``, ``sigterm``, ``SIGTERM`` -> ``SIGTERM``; ValueError naming the valid ones otherwise."""
    name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
    if name not in SIGNALS:
        raise ValueError(f"unknown signal {value!r}; valid: {', '.join(SIGNALS)}")
    return name


class RankFaultOptions(FaultOptions):
    rank: RankSelector = "random"


def verify_all(task: FaultTask) -> list[VerifiedTarget]:
    """Every target rank of the task on this node, verified before any is touched."""
    return [verify_rank(task.run_dir, task.run_id, task.attempt, rank, task.job_id) for rank in task.ranks]


def wait_until(moment: float) -> None:
    """Agents on several nodes act together: each sleeps until the agreed moment."""
    delay = moment - time.time()
    if delay > 0:
        time.sleep(delay)


def send(targets: list[VerifiedTarget], name: str) -> float:
    """Signal every target at once (one instant, as near as the kernel allows); when it happened
    (see ``send_to``)."""
    return send_to(targets, name)[0]


def send_to(targets: list[VerifiedTarget], name: str) -> tuple[float, list[VerifiedTarget]]:
    """Signal every target at once; when it happened, and the targets signalled. A target that
    ended since it was verified (or left its attempt) gets nothing (the agent once died of the
    ProcessLookupError, which the controller took for a failed kill); if every target ended, they are
    gone (TargetRefused, gone): their launch ended them first."""
    number = signal.Signals[name]
    at = time.time()
    signalled = [target for target in targets if delivered(target, number)]
    if targets and not signalled:
        ranks = ",".join(str(target.rank) for target in targets)
        raise TargetRefused(f"rank(s) {ranks} ended after they were verified, before the {name}", gone=True)
    return at, signalled


def delivered(target: VerifiedTarget, number: int) -> bool:
    """``number`` to ``target``; False if it has ended or left its attempt since its verification
    (signal_target's gone), so it got nothing."""
    try:
        signal_target(target, number)
    except ProcessLookupError:
        return False
    except TargetRefused as error:  # it left the attempt (a warm process, now in the next one)
        if not error.gone:
            raise
        return False
    return True


def outcome(kind: str, targets: list[VerifiedTarget], signal_name: str, at: float, detail: str = "",
            met_step: int | None = None) -> FaultOutcome:
    """What the kind did to ``targets``; ``met_step``: the step an at_step fault's agent saw when it acted."""
    ranks = ",".join(str(t.rank) for t in targets)
    node = targets[0].node if targets else ""
    label = f"rank {ranks}" if len(targets) == 1 else f"ranks {ranks}"
    return FaultOutcome(kind=kind, target=f"{label}@{node}", at=at, node=node,
                        pid=targets[0].pid if targets else None, signal=signal_name, detail=detail, met_step=met_step)
