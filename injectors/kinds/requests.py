"""Asking verified ranks to act a fault out themselves (experiments/runtime/fault_requests), and
waiting for them to end of it: the part oom-rank and rank-error share."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from experiments.layout import RunPaths, write_json_atomic
from experiments.runtime.fault_requests import FAULT_SIGNAL
from experiments.runtime.identity import start_ticks
from injectors.kinds.base import FaultTask
from injectors.kinds.signals import delivered
from injectors.targets import TargetRefused, VerifiedTarget


def ask(task: FaultTask, targets: list[VerifiedTarget], request: dict[str, Any]) -> tuple[float, list[VerifiedTarget]]:
    """Write each target's request, then signal them all; when the signals went out, and the targets
    asked. A target that ended or left its attempt since it was verified (a warm process, now in the
    next one) is not asked (its request is taken back); if none was asked, TargetRefused (gone)."""
    paths = RunPaths(Path(task.run_dir))
    for target in targets:
        write_json_atomic(paths.fault_request_file(task.attempt, target.rank), request)
    at = time.time()
    asked = [target for target in targets if delivered(target, FAULT_SIGNAL)]
    for target in targets:
        if target not in asked:
            paths.fault_request_file(task.attempt, target.rank).unlink(missing_ok=True)
    if not asked:
        raise TargetRefused(f"rank(s) {','.join(str(t.rank) for t in targets)} ended or left their attempt after "
                            "they were verified, before they were asked", gone=True)
    return at, asked


class JobEnding:
    """SIGTERM (the scheduler ending the job's steps once a rank died) stops the wait, not the
    agent: it still reads what happened, cleans up and prints its record."""

    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True


def live_ticks(targets: list[VerifiedTarget]) -> dict[int, int | None]:
    """The targets' start ticks, taken before they are asked: what "the same process" means."""
    return {target.pid: start_ticks(target.pid) for target in targets}


def wait_for_ends(targets: list[VerifiedTarget], ticks: dict[int, int | None], deadline: float,
                  ending: JobEnding, on_tick: Callable[[], None] | None = None) -> dict[int, float]:
    """When each target ended (no longer the live process of those start ticks), until the
    deadline or the job's end; targets by pid. ``on_tick``: called at every look (a reading the
    caller takes while the targets live: a cgroup the scheduler removes with its step)."""
    ended: dict[int, float] = {}
    while True:
        if on_tick is not None:
            on_tick()
        for target in targets:
            current = start_ticks(target.pid) if target.pid not in ended else None
            if target.pid not in ended and (current is None or current != ticks[target.pid]):
                ended[target.pid] = time.time()
        if len(ended) == len(targets) or time.time() >= deadline or ending.asked:
            return ended
        time.sleep(0.01)
