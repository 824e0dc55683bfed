"""The drill's story as it happens: a line per event of each run, from what the ledger holds (the
record, never a guess): a fault that acted (its target, pid and the step it met), an attempt that
failed (its class, and how long after the fault that was seen), a job submitted, the first step of
a recovered attempt (how long after the fault, from which step, the work lost), a run's end. Each
run's last event and when it came are kept for ``faultdrill status`` (progress.json), and a run
that made no progress for STALL_STEPS of its steps (at least STALL_LEAST_S) is said to be stalled.

A sweep's runs that wait for their turn, and those whose end was told (and read once more after,
for a fault's late word), are not read again: a round's reading follows the runs in flight, not
the sweep's size (issue 29)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.record.ledger import Ledger

if TYPE_CHECKING:
    from orchestrator.control.tracker import RunTracker

STALL_STEPS = 50  # no new step for this many of the run's step times: stalled
STALL_LEAST_S = 30.0  # ... and for at least this long (a checkpoint, a start-up are not stalls)
LOOK_EVERY_S = 0.5  # the ledger is read at most this often


@dataclass
class RunStory:
    """What was told of one run: the events said, its last one and when, its steps' pace."""

    said: set[tuple[object, ...]] = field(default_factory=set)
    last_event: str = ""
    last_event_at: float | None = None
    step: tuple[int, int] = (-1, -1)  # (attempt, step): a new attempt is progress too
    step_since: float = 0.0

    def stalled_for(self, now: float, step: tuple[int, int], step_s: float | None, running: bool) -> float | None:
        """How long the run has made no progress, once that is a stall; None while it progresses
        (``running``: its attempt trains: the job runs and a step was heard)."""
        if step != self.step or not running:
            self.step, self.step_since = step, now
            return None
        quiet = now - self.step_since
        least = max(STALL_LEAST_S, STALL_STEPS * (step_s or 0.0))
        return quiet if running and quiet > least else None


class Story:
    """Observer part: new events of every run, as lines ("HH:MM:SS r000 ..."), each told once.

    Reads the runs whose story is open: each run a round touched (in flight, or a failed job
    closing) from then until its end was told and read once more; a run that waits for its turn
    or was settled costs nothing (``new_lines`` takes the round's touched runs, not the sweep)."""

    def __init__(self) -> None:
        self.runs: dict[str, RunStory] = {}
        self._looked = 0.0
        self._ended_told: set[str] = set()  # runs whose end was told: read once more, then settled
        self.settled: set[str] = set()  # runs whose story is told to its end: not read again
        self._open: dict[str, "RunTracker"] = {}  # runs to read: touched, not settled
        self._read_as_of: dict[str, tuple[object, ...]] = {}  # run -> its ledger writes and status when last read

    def quiet(self, tracker: "RunTracker") -> bool:
        """Nothing new can come from this run: it waits for its first turn, or its story is told."""
        return tracker.run.run_id in self.settled or not_begun(tracker)

    def new_lines(self, touched: list["RunTracker"], now: float | None = None) -> list[str]:
        """The new events of the open runs, ``touched`` (this round's) among them; every runs' on
        the first call (a controller that adopts a drill tells what its runs did meanwhile)."""
        for tracker in touched:
            if tracker.run.run_id not in self.settled:
                self._open[tracker.run.run_id] = tracker
        now = time.time() if now is None else now
        if now - self._looked < LOOK_EVERY_S:
            return []
        self._looked = now
        lines = []
        asked_others: set[int] = set()
        for run_id, tracker in list(self._open.items()):
            if self.quiet(tracker):
                del self._open[run_id]  # a waiting run is touched again when it starts
                continue
            if run_id in self._ended_told:
                self.settled.add(run_id)  # this is its read after the end
                del self._open[run_id]
            if id(tracker.ledger) not in asked_others:  # once a look: another process's commit reads every run again
                asked_others.add(id(tracker.ledger))
                tracker.ledger.others_committed()
            as_of = (*tracker.ledger.writes(run_id), tracker.status)
            if self._read_as_of.get(run_id) == as_of:
                if tracker.queued_unheard:  # its job waits in the scheduler's queue: told to now
                    del self._open[run_id]  # touched again when it starts
                continue  # nothing of the run written since it was read: no new event
            self._read_as_of[run_id] = as_of
            story = self.runs.setdefault(run_id, RunStory())
            for key, moment, text in _events(tracker.ledger, run_id, tracker.status):
                if key in story.said:
                    continue
                story.said.add(key)
                story.last_event, story.last_event_at = text, moment
                lines.append(f"{time.strftime('%H:%M:%S', time.localtime(moment))} {run_id} {text}")
                if key[0] == "ended":
                    self._ended_told.add(run_id)
        return lines


def not_begun(tracker: "RunTracker") -> bool:
    """The run waits for its first turn (a sweep's runs beyond parallel_runs): nothing to read yet."""
    return tracker.status == "pending" and tracker.watch is None


def _events(ledger: Ledger, run_id: str, status: str) -> list[tuple[tuple[object, ...], float, str]]:
    """(key, moment, words) of every event of the run the ledger holds, oldest first."""
    events: list[tuple[tuple[object, ...], float, str]] = []
    faults = ledger.faults(run_id)
    acted = {fault.attempt: fault.at for fault in faults if fault.at is not None}
    for fault in faults:
        if fault.at is not None and fault.outcome not in ("refused", "not fired", "sending"):  # once it says the step
            said = ", ".join(part for part in (f"pid {fault.pid}" if fault.pid else "",
                                               f"step {fault.met_step}" if fault.met_step is not None else "") if part)
            events.append((("fault", fault.fault_id), fault.at,
                           f"{fault.kind} -> {fault.target}" + (f" ({said})" if said else "")))
        elif fault.outcome == "refused":
            events.append((("refused", fault.fault_id), time.time(), f"{fault.kind} refused: {fault.detail or ''}"))
    for attempt in ledger.attempts(run_id):
        if attempt.job_id and attempt.accepted is not None:
            events.append((("submitted", attempt.attempt), attempt.accepted,
                           f"attempt {attempt.attempt} submitted: job {attempt.job_id}"))
        if attempt.failure_class and attempt.detected is not None:
            after = acted.get(attempt.attempt)
            when = f" {attempt.detected - after:.2f} s after the fault" if after is not None else ""
            events.append((("failed", attempt.attempt), attempt.detected,
                           f"attempt {attempt.attempt} failed: {attempt.failure_class}, detected{when}"))
    for recovery in ledger.recoveries(run_id):
        events.append((("recovered", recovery.attempt), recovery.fault_at + recovery.ttr_s,
                       f"attempt {recovery.attempt} trains again: first step {recovery.ttr_s:.1f} s after the "
                       f"failure, resumed from step {recovery.resumed_from_step}, {recovery.lost_steps} steps lost"))
    if status not in ("running", "pending", "submitting"):
        events.append((("ended", status), time.time(), f"run {status}"))
    return sorted(events, key=lambda event: event[1])
