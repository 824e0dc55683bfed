"""Live progress of a drill: its story as it happens (a line per event: orchestrator/control/story.py)
above a table that redraws on a terminal (each run's step, its last event and its age, a stall
flagged, the time elapsed), the lines alone elsewhere; the same rows in ``<workdir>/progress.json``
for ``faultdrill status`` (a drill running detached)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from orchestrator.control.story import Story, not_begun
from orchestrator.control.tracker import RunTracker
from orchestrator.report.answer import TERMINAL_ROWS, short_cause
from orchestrator.report.tables import Table, rows_shown
from orchestrator.states import JobState

REDRAW_INTERVAL_S = 0.25
PROGRESS_NAME = "progress.json"
PROGRESS_WRITE_INTERVAL_S = 1.0
UNDER_WAY = ("running", "submitting")
ROWS_PER_SECOND = 2000  # progress.json of a large sweep: at most this many rows written a second


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
    """Every run's progress row, kept from round to round and rebuilt only for the runs whose row
    can change: those a round touched (in flight, a failed job closing), until their row was built
    after their story was settled. A run that waits for its turn, or whose row is final, costs a
    round nothing (issue 29); ``counts`` holds the rows by status, kept as they change."""

    def __init__(self, story: Story) -> None:
        self.story = story
        self._rows: dict[str, ProgressRow] = {}  # every run's, in the trackers' order
        self._open: dict[str, RunTracker] = {}  # rows to rebuild: touched, not final
        self._final: set[str] = set()  # runs whose row was built after their story was settled
        self.counts: Counter[str] = Counter()

    def update(self, trackers: list[RunTracker], touched: list[RunTracker],
               now: float | None = None) -> list[ProgressRow]:
        """The rows rebuilt this round (every run's the first time)."""
        for tracker in trackers if not self._rows else touched:
            run_id = tracker.run.run_id
            if self._stands(tracker):
                self._open.pop(run_id, None)  # waits for its turn, or in the scheduler's queue: its row stands
            elif run_id not in self._final:
                self._open[run_id] = tracker
        building = list(self._open.values())
        built = progress_rows(building, self.story, now)
        for tracker, row in zip(building, built, strict=True):
            before = self._rows.get(row.run)
            if before is not None:
                self.counts[before.status] -= 1
            self.counts[row.status] += 1
            self._rows[row.run] = row
            if row.run in self.story.settled:
                self._final.add(row.run)
                del self._open[row.run]
            elif self._stands(tracker):
                del self._open[row.run]  # touched again when it starts
        return built

    def _stands(self, tracker: RunTracker) -> bool:
        """The run's row cannot change until a round touches it again: the run waits for its first
        turn, or its job waits in the scheduler's queue unheard and the row already says so."""
        row = self._rows.get(tracker.run.run_id)
        if row is None:
            return False
        told = self.story.runs.get(row.run)
        return not_begun(tracker) or (tracker.queued_unheard and row.job == tracker.job_id
                                      and row.status == tracker.status and row.state == JobState.PENDING.value
                                      and row.last_event_at == (told.last_event_at if told else None))

    def rows(self, trackers: list[RunTracker], now: float | None = None) -> list[ProgressRow]:
        """Every run's row, in the trackers' order, each rebuilt where it can have changed."""
        self.update(trackers, trackers, now)
        return [self._rows[tracker.run.run_id] for tracker in trackers]

    def all_rows(self) -> list[ProgressRow]:
        return list(self._rows.values())

    def open_rows(self) -> list[ProgressRow]:
        """The rows that can still change: the runs in flight and those just ended."""
        return [self._rows[run_id] for run_id in self._open if run_id in self._rows]


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
                   now: float | None = None, counts: Counter[str] | None = None) -> Table:
    """The rows, as many as a terminal shows (past TERMINAL_ROWS: the runs in flight, stalled or
    failed first), and one row counting the rest by status: of ``rows``, or of ``counts`` (every
    run's) where ``rows`` are some of the runs (the live display's: those that can change)."""
    now = time.time() if now is None else now
    table = Table(title=title)
    for column in ("run", "status", "attempt", "job", "state", "step", "faults", "last event"):
        table.add_column(column, no_wrap=column != "last event")
    if len(rows) > TERMINAL_ROWS:  # the runs under way before those that ended badly
        rows = sorted(rows, key=_priority)
    shown, rest = rows_shown(rows, _notable)
    left = Counter(row.status for row in rest) if counts is None else counts - Counter(row.status for row in shown)
    for row in shown:
        step = f"{row.step}/{row.target_steps}"
        if row.stalled_s is not None:
            step += f" STALLED {row.stalled_s:.0f} s"
        event = (f"{short_cause(row.last_event, 60)} ({_age(now - row.last_event_at)} ago)"
                 if row.last_event_at is not None else "-")
        table.add_row(row.run, row.status, "-" if row.attempt is None else str(row.attempt), row.job or "-",
                      row.state or "-", step, f"{row.faults_sent}/{row.faults_planned}", event)
    if +left:
        table.add_row(f"{sum((+left).values())} more", ", ".join(f"{status} {count}" for status, count in
                                                                 (+left).most_common()), "", "", "", "", "", "")
    return table


def _priority(row: ProgressRow) -> int:
    """Of a long table's rows, which come first: stalled, then under way, then ended badly."""
    return 0 if row.stalled_s is not None else 1 if row.status in UNDER_WAY else 2 if _notable(row) else 3


def _notable(row: ProgressRow) -> bool:
    """A row a long table lists by name: its run is under way or did not end well, or it stalled."""
    return row.stalled_s is not None or row.status not in ("pending", "completed")


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class ProgressFile:
    """Observer for Controller.run: the progress rows in ``<workdir>/progress.json``, when one
    changed, at most once a second (once every ``rows / ROWS_PER_SECOND`` seconds for a large
    sweep: the file holds every run), and on ``close`` (the last word). A rebuilt row is compared
    with the one kept (a round rebuilds every row in flight, most with a new step); a row that
    changed is serialized at the next write, once however many rounds changed it, and a write
    joins what is kept."""

    def __init__(self, workdir: Path, story: Story | None = None, book: RowBook | None = None) -> None:
        self.path = workdir / PROGRESS_NAME
        self.book = book or RowBook(story or Story())
        self._last_write = float("-inf")
        self._kept: dict[str, ProgressRow] = {}
        self._serialized: dict[str, str] = {}  # every run's row as JSON, in the trackers' order
        self._changed: set[str] = set()  # runs whose row changed since the last write

    def __call__(self, trackers: list[RunTracker], touched: list[RunTracker] | None = None) -> None:
        self.keep(self.book.update(trackers, trackers if touched is None else touched))

    def keep(self, rows: list[ProgressRow]) -> None:
        """The rows rebuilt this round (by this file's book, or the live display's it shares)."""
        for row in rows:
            if self._kept.get(row.run) != row:
                self._kept[row.run] = row
                self._serialized.setdefault(row.run, "")  # its place in the file: the first row's
                self._changed.add(row.run)
        now = time.monotonic()
        if self._changed and now - self._last_write >= self.write_interval_s():
            self._write(now)

    def write_interval_s(self) -> float:
        return max(PROGRESS_WRITE_INTERVAL_S, len(self._serialized) / ROWS_PER_SECOND)

    def close(self) -> None:
        if self._changed:
            self._write(time.monotonic())

    def _write(self, now: float) -> None:
        for run in self._changed:
            self._serialized[run] = json.dumps(self._kept[run].__dict__)
        self._last_write = now
        self._changed.clear()
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(f'{{"updated": {time.time()!r}, "controller_pid": {os.getpid()}, "runs": ['
                       + ", ".join(self._serialized.values()) + "]}")
        os.replace(tmp, self.path)


def read_progress(workdir: Path) -> tuple[float, list[ProgressRow]] | None:
    try:
        data = json.loads((workdir / PROGRESS_NAME).read_text())
        return float(data["updated"]), [ProgressRow(**row) for row in data["runs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


LINES_PER_LOOK = 40  # story lines printed at one look; the rest counted


class Progress:
    """Observer for Controller.run: a live table on a terminal, one line per change otherwise."""

    def __init__(self, console: Console | None = None, story: Story | None = None, book: RowBook | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.story = story or Story()
        self.book = book or RowBook(self.story)
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

    def __call__(self, trackers: list[RunTracker], touched: list[RunTracker] | None = None) -> None:
        touched = trackers if touched is None else touched
        lines = self.story.new_lines(touched)
        now = time.time()
        self.show(lines, self.book.update(trackers, touched, now), now)

    def show(self, lines: list[str], rows: list[ProgressRow], now: float) -> None:
        """This round's story lines and rebuilt rows (``DrillProgress``: rows its file keeps too)."""
        for line in lines[:LINES_PER_LOOK]:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)
        if len(lines) > LINES_PER_LOOK:  # a sweep's arrays submitted: not 10,000 lines on a terminal
            self.console.print(f"{time.strftime('%H:%M:%S')} ... and {len(lines) - LINES_PER_LOOK:,} more events "
                               "(every one in the ledger: faultdrill status / report)", highlight=False, markup=False)
        for row in rows:  # a stall said once as a line (the live table shows it as long as it lasts)
            if row.stalled_s is not None and row.run not in self._stalls_said:
                self._stalls_said.add(row.run)
                self.console.print(f"{time.strftime('%H:%M:%S')} {row.run} STALLED: no new step for "
                                   f"{row.stalled_s:.0f} s (at step {row.step}/{row.target_steps})",
                                   highlight=False, markup=False)
            elif row.stalled_s is None:
                self._stalls_said.discard(row.run)
        if self._live is not None and time.monotonic() - self._last_draw >= REDRAW_INTERVAL_S:
            self._live.update(progress_table(self.book.open_rows(), f"Faultdrill: drill in progress, "
                                             f"{_age(now - self._started)} elapsed", now, self.book.counts))
            self._last_draw = time.monotonic()


class DrillProgress:
    """A drill's observer (Controller.run): its story, the live display and ``progress.json``, the
    rows rebuilt once a round for both (one RowBook: issue 29, a round's work)."""

    def __init__(self, workdir: Path, console: Console | None = None) -> None:
        self.story = Story()
        self.book = RowBook(self.story)
        self.display = Progress(console, self.story, self.book)
        self.file = ProgressFile(workdir, self.story, self.book)

    def __enter__(self) -> "DrillProgress":
        self.display.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.display.__exit__(*exc)

    def __call__(self, trackers: list[RunTracker], touched: list[RunTracker]) -> None:
        lines = self.story.new_lines(touched)
        now = time.time()
        rows = self.book.update(trackers, touched, now)
        self.display.show(lines, rows, now)
        self.file.keep(rows)

    def close(self) -> None:
        """The last word of every run in progress.json."""
        self.file.close()
