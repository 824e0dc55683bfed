"""What the job kinds (preempt, timeout) share: the scheduler's warning as the ranks saw it, and
waiting, with a deadline, for the scheduler to end the job."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from experiments.layout import EVENT_WARNED, RunPaths, read_events
from injectors.kinds.base import JobControl
from injectors.targets import TargetRefused

POLL_S = 0.25


@dataclass(frozen=True)
class Warned:
    """Rank 0's ``warned`` event: it got the warning at ``received_at`` and saved ``step``."""

    received_at: float
    step: int
    checkpoint_s: float
    saved_at: float  # when rank 0 had the checkpoint durable (the event's time)


def warned_event(run_dir: Path, attempt: int, since: float) -> Warned | None:
    for event in read_events(RunPaths(run_dir).events_file(attempt)):
        if event.name == EVENT_WARNED and event.time >= since:
            return Warned(received_at=event.number("received_at", event.time), step=int(event.number("step", 0)),
                          checkpoint_s=event.number("checkpoint_s", 0.0), saved_at=event.time)
    return None


def wait_for_warned(run_dir: Path, attempt: int, since: float, deadline_s: float) -> Warned | None:
    """The ranks' checkpoint on the warning, once it is durable, or None by the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        found = warned_event(run_dir, attempt, since)
        if found is not None or time.monotonic() >= end:
            return found
        time.sleep(POLL_S)


def wait_for_job_end(control: JobControl, deadline_s: float, every_s: float = 5.0) -> float | None:
    """When the job was seen no longer running (one scheduler call per ``every_s``, the
    controller's own respectful pace); None if it still runs at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            control.verify_running()
        except TargetRefused:
            return time.time()
        time.sleep(max(0.0, min(every_s, end - time.monotonic())))
    return None


def saved(warned: Warned | None, signal_at: float) -> str:
    if warned is None:
        return "the ranks saved nothing"
    return (f"ranks saved step {warned.step} ({warned.checkpoint_s:.2f} s to durable), "
            f"{warned.saved_at - signal_at:.2f} s after the warning")
