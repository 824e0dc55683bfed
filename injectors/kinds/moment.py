"""When a rank fault acts, on its node: at the moment agents on several nodes agreed on, or, for an
``at_step`` fault, when the attempt reaches the step.

An ``at_step`` fault's agent is started ahead of its step (the controller's poll and the agent's
start take a second on a cluster: tens to hundreds of fast steps). It verifies its targets, then
reads the attempt's heartbeat files on this node every few milliseconds (each rank writes one at once
at every step a planned fault names: experiments/runtime/heartbeat.py) and acts as soon as one shows
the step. It stops waiting when every target has ended or left its attempt (gone: the fault came too
late), when the scheduler ends the job's steps (SIGTERM: gone), or after the task's ``wait_s``
(StepNotReached: the controller starts it again closer to the step).
"""

from __future__ import annotations

import time
from pathlib import Path

from experiments.layout import Heartbeat, JsonlTail, RunPaths
from injectors.kinds.base import FaultTask
from injectors.kinds.requests import JobEnding
from injectors.kinds.signals import delivered, wait_until
from injectors.targets import StepNotReached, TargetRefused, VerifiedTarget

POLL_S = 0.005  # a step of 20 ms is met within a quarter of it
LIVENESS_EVERY_S = 0.1  # the targets' liveness and the heartbeat files present, checked this often


def wait_for_moment(task: FaultTask, targets: list[VerifiedTarget], ending: JobEnding | None = None) -> int | None:
    """Until the task's step (an ``at_step`` fault: the step seen, which the fault met) or its agreed
    moment (agents on several nodes); ``ending``: the kind's own SIGTERM watch, if it made one (a
    second would replace it)."""
    if task.at_step is None:
        wait_until(task.not_before)
        return None
    return wait_for_step(task, targets, ending or JobEnding())


def wait_for_step(task: FaultTask, targets: list[VerifiedTarget], ending: JobEnding) -> int:
    """Block until the attempt's heartbeats show ``task.at_step`` (or later); the step seen."""
    assert task.at_step is not None
    steps = HeartbeatSteps(RunPaths(Path(task.run_dir)), task.attempt, tuple(t.rank for t in targets))
    deadline = time.monotonic() + task.wait_s
    next_check = 0.0
    while True:
        step = steps.newest()
        if step >= task.at_step:
            return step
        now = time.monotonic()
        if ending.asked:
            raise TargetRefused(f"the job's steps were ended at step {step}, before step {task.at_step}", gone=True)
        if now >= next_check:
            _require_one_alive(targets, step, task.at_step)
            steps.look_for_files()
            next_check = now + LIVENESS_EVERY_S
        if now >= deadline:
            raise StepNotReached(f"the attempt was at step {step} after {task.wait_s:g} s, short of step {task.at_step}")
        time.sleep(POLL_S)


def _require_one_alive(targets: list[VerifiedTarget], step: int, at_step: int) -> None:
    """TargetRefused (gone) once no target is alive in its attempt: the fault would hit nothing."""
    if targets and not any(delivered(target, 0) for target in targets):
        ranks = ",".join(str(target.rank) for target in targets)
        raise TargetRefused(f"rank(s) {ranks} ended or left their attempt at step {step}, before step {at_step}",
                            gone=True)


class HeartbeatSteps:
    """The newest step in the attempt's heartbeat files: the targets' own where they write one (a
    rank API rank), else every file of the attempt (torchrun's workers: one file per node)."""

    def __init__(self, paths: RunPaths, attempt: int, ranks: tuple[int, ...]) -> None:
        self.paths, self.attempt, self.ranks = paths, attempt, ranks
        self.tails: dict[Path, JsonlTail[Heartbeat]] = {}
        self.step = 0
        self.look_for_files()

    def look_for_files(self) -> None:
        own = [self.paths.heartbeat_file(self.attempt, rank) for rank in self.ranks]
        for path in [path for path in own if path.exists()] or self.paths.heartbeat_files(self.attempt):
            self.tails.setdefault(path, JsonlTail(path, Heartbeat.from_json))

    def newest(self) -> int:
        for tail in self.tails.values():
            self.step = max([self.step, *(beat.step for beat in tail.read_new() if beat.attempt == self.attempt)])
        return self.step
