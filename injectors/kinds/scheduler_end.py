"""What the job kinds (preempt, timeout) share: the scheduler's warning as the ranks saw it, and
waiting, with a deadline, for the scheduler to end the job."""

from __future__ import annotations

import time
from dataclasses import dataclass

from experiments.layout import EVENT_WARNED, RunPaths, read_attempt_events
from injectors.kinds.base import FaultTask, JobControl
from injectors.targets import TargetRefused, read_identity

POLL_S = 0.25


@dataclass(frozen=True)
class Warned:
    """Rank 0's ``warned`` event: it got the warning at ``received_at`` and saved ``step`` (both
    moments on the login node's clock: rank 0's stamps moved by its node's offset)."""

    received_at: float
    step: int
    checkpoint_s: float
    saved_at: float  # when rank 0 had the checkpoint durable (the event's time)


def warned_event(task: FaultTask, since: float) -> Warned | None:
    """Rank 0's first ``warned`` event of the task's attempt at or after ``since`` (the login clock's)."""
    try:
        node = read_identity(task.run_dir, task.attempt, 0).node
    except TargetRefused:
        node = ""  # rank 0 never registered: its stamps are read as they are
    for event in read_attempt_events(RunPaths(task.run_dir), task.attempt):
        saved_at = task.on_login(event.time, node)
        if event.name == EVENT_WARNED and saved_at >= since:
            return Warned(received_at=task.on_login(event.number("received_at", event.time), node),
                          step=int(event.number("step", 0)), checkpoint_s=event.number("checkpoint_s", 0.0),
                          saved_at=saved_at)
    return None


def wait_for_warned(task: FaultTask, since: float, deadline_s: float) -> Warned | None:
    """The ranks' checkpoint on the warning, once it is durable, or None by the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        found = warned_event(task, since)
        if found is not None or time.monotonic() >= end:
            return found
        time.sleep(POLL_S)


def wait_for_job_end(control: JobControl, deadline_s: float, every_s: float = 5.0) -> float | None:
    """When the job was seen no longer running (one scheduler call per ``every_s``, the
    controller's own respectful pace); None if it still runs at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            control.verify_running(fresh=False)  # the controller's poll: no scheduler call of this loop's own
        except TargetRefused:
            return time.time()
        time.sleep(max(0.0, min(every_s, end - time.monotonic())))
    return None


def saved(warned: Warned | None, signal_at: float) -> str:
    if warned is None:
        return "the ranks saved nothing"
    return (f"ranks saved step {warned.step} ({warned.checkpoint_s:.2f} s to durable), "
            f"{warned.saved_at - signal_at:.2f} s after the warning")
