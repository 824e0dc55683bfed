"""Live progress of a drill: its story as it happens (a line per event: orchestrator/control/story.py)
above a table that redraws on a terminal (each run's step, its last event and its age, a stall
flagged, the time elapsed), the lines alone elsewhere; the same rows in ``<workdir>/progress.json``
for ``faultdrill status`` (a drill running detached)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from orchestrator.control.story import Story, not_begun
from orchestrator.control.tracker import RunTracker
from orchestrator.report.answer import short_cause
from orchestrator.report.tables import Table

REDRAW_INTERVAL_S = 0.25
PROGRESS_NAME = "progress.json"
PROGRESS_WRITE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ProgressRow:
    run: str
    status: str
    attempt: int | None
    job: str | None
    state: str | None
    step: int
    target_steps: int
    faults_sent: int
    faults_planned: int
    last_event: str = ""  # the run's last event, in words (orchestrator/control/story.py)
    last_event_at: float | None = None  # when it came (this host's clock)
    stalled_s: float | None = None  # no new step this long (once that is a stall), else None


class RowBook:
    """Every run's progress row, kept from round to round: the row of a run that waits for its
    first turn, or whose story is told to its end (built once more after that), is not built
    again (a sweep's round costs what its runs in flight cost: issue 29)."""

    def __init__(self, story: Story) -> None:
        self.story = story
        self._rows: dict[str, ProgressRow] = {}
        self._final: set[str] = set()  # runs whose row was built after their story was settled

    def rows(self, trackers: list[RunTracker], now: float | None = None) -> list[ProgressRow]:
        changing = [tracker for tracker in trackers if not self._kept(tracker)]
        for tracker, row in zip(changing, progress_rows(changing, self.story, now), strict=True):
            self._rows[row.run] = row
            if tracker.run.run_id in self.story.settled:
                self._final.add(row.run)
        return [self._rows[tracker.run.run_id] for tracker in trackers]

    def _kept(self, tracker: RunTracker) -> bool:
        run_id = tracker.run.run_id
        return run_id in self._final or (run_id in self._rows and not_begun(tracker))


def progress_rows(trackers: list[RunTracker], story: Story | None = None, now: float | None = None) -> list[ProgressRow]:
    now = time.time() if now is None else now
    rows = []
    for tracker in trackers:
        watch = tracker.watch
        told = story.runs.get(tracker.run.run_id) if story is not None else None
        step = watch.last_step if watch else 0
        pace = watch.steps_per_s() if watch else None
        # only an attempt that is training (its job running, a step heard): a queue or a start-up is no stall
        training = (tracker.status == "running" and watch is not None and watch.state.value == "RUNNING"
                    and watch.last_step_heard is not None)
        stalled = (told.stalled_for(now, (watch.attempt if watch else -1, step), 1 / pace if pace else None, training)
                   if told is not None else None)
        rows.append(ProgressRow(
            run=tracker.run.run_id, status=tracker.status, attempt=watch.attempt if watch else None,
            job=tracker.job_id, state=watch.state.value if watch else None, step=step,
            target_steps=tracker.run.workload.steps, faults_sent=tracker.faults.sent, faults_planned=len(tracker.plan),
            last_event=told.last_event if told else "", last_event_at=told.last_event_at if told else None,
            stalled_s=stalled,
        ))
    return rows


def progress_table(rows: list[ProgressRow], title: str = "Faultdrill: drill in progress",
                   now: float | None = None) -> Table:
    now = time.time() if now is None else now
    table = Table(title=title)
    for column in ("run", "status", "attempt", "job", "state", "step", "faults", "last event"):
        table.add_column(column, no_wrap=column != "last event")
    for row in rows:
        step = f"{row.step}/{row.target_steps}"
        if row.stalled_s is not None:
            step += f" STALLED {row.stalled_s:.0f} s"
        event = (f"{short_cause(row.last_event, 60)} ({_age(now - row.last_event_at)} ago)"
                 if row.last_event_at is not None else "-")
        table.add_row(row.run, row.status, "-" if row.attempt is None else str(row.attempt), row.job or "-",
                      row.state or "-", step, f"{row.faults_sent}/{row.faults_planned}", event)
    return table


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class ProgressFile:
    """Observer for Controller.run: the progress rows in ``<workdir>/progress.json``, at most once
    a second, and at once when a run's status or attempt changed (so the last word is written)."""

    def __init__(self, workdir: Path, story: Story | None = None) -> None:
        self.path = workdir / PROGRESS_NAME
        self.book = RowBook(story or Story())
        self._last_write = 0.0
        self._last_key: list[tuple[str, int | None, str | None, str]] = []

    def __call__(self, trackers: list[RunTracker]) -> None:
        rows = self.book.rows(trackers)
        key = [(row.status, row.attempt, row.state, row.last_event) for row in rows]
        now = time.monotonic()
        if key == self._last_key and now - self._last_write < PROGRESS_WRITE_INTERVAL_S:
            return
        self._last_write, self._last_key = now, key
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"updated": time.time(), "controller_pid": os.getpid(),
                                   "runs": [asdict(row) for row in rows]}))
        os.replace(tmp, self.path)


def read_progress(workdir: Path) -> tuple[float, list[ProgressRow]] | None:
    try:
        data = json.loads((workdir / PROGRESS_NAME).read_text())
        return float(data["updated"]), [ProgressRow(**row) for row in data["runs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Progress:
    """Observer for Controller.run: a live table on a terminal, one line per change otherwise."""

    def __init__(self, console: Console | None = None, story: Story | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.story = story or Story()
        self.book = RowBook(self.story)
        self._live: Live | None = None
        self._last_draw = 0.0
        self._started = time.time()
        self._stalls_said: set[str] = set()

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def __call__(self, trackers: list[RunTracker]) -> None:
        for line in self.story.new_lines(trackers):
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)
        now = time.time()
        rows = self.book.rows(trackers, now)
        for row in rows:  # a stall said once as a line (the live table shows it as long as it lasts)
            if row.stalled_s is not None and row.run not in self._stalls_said:
                self._stalls_said.add(row.run)
                self.console.print(f"{time.strftime('%H:%M:%S')} {row.run} STALLED: no new step for "
                                   f"{row.stalled_s:.0f} s (at step {row.step}/{row.target_steps})",
                                   highlight=False, markup=False)
            elif row.stalled_s is None:
                self._stalls_said.discard(row.run)
        if self._live is not None and time.monotonic() - self._last_draw >= REDRAW_INTERVAL_S:
            self._live.update(progress_table(rows, f"Faultdrill: drill in progress, {_age(now - self._started)} "
                                                   "elapsed", now))
            self._last_draw = time.monotonic()
