"""Live progress of a drill: a table that redraws on a terminal, plain lines elsewhere, and the
same rows in ``<workdir>/progress.json`` for ``faultdrill status`` (a drill running detached)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from orchestrator.control.tracker import RunTracker
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


def progress_rows(trackers: list[RunTracker]) -> list[ProgressRow]:
    rows = []
    for tracker in trackers:
        watch = tracker.watch
        rows.append(ProgressRow(
            run=tracker.run.run_id, status=tracker.status, attempt=watch.attempt if watch else None,
            job=tracker.job_id, state=watch.state.value if watch else None, step=watch.last_step if watch else 0,
            target_steps=tracker.run.workload.steps, faults_sent=tracker.faults.sent, faults_planned=len(tracker.plan),
        ))
    return rows


def progress_table(rows: list[ProgressRow], title: str = "Faultdrill: drill in progress") -> Table:
    table = Table(title=title)
    for column in ("run", "status", "attempt", "job", "state", "step", "faults sent"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.run, row.status, "-" if row.attempt is None else str(row.attempt), row.job or "-",
                      row.state or "-", f"{row.step}/{row.target_steps}", f"{row.faults_sent}/{row.faults_planned}")
    return table


def _table(trackers: list[RunTracker]) -> Table:
    return progress_table(progress_rows(trackers))


class ProgressFile:
    """Observer for Controller.run: the progress rows in ``<workdir>/progress.json``, at most once
    a second, and at once when a run's status or attempt changed (so the last word is written)."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / PROGRESS_NAME
        self._last_write = 0.0
        self._last_key: list[tuple[str, int | None, str | None]] = []

    def __call__(self, trackers: list[RunTracker]) -> None:
        rows = progress_rows(trackers)
        key = [(row.status, row.attempt, row.state) for row in rows]
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

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._last_draw = 0.0
        self._last_lines: dict[str, str] = {}

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def __call__(self, trackers: list[RunTracker]) -> None:
        if self._live is not None:
            now = time.monotonic()
            if now - self._last_draw >= REDRAW_INTERVAL_S:
                self._live.update(_table(trackers))
                self._last_draw = now
            return
        for tracker in trackers:
            watch = tracker.watch
            line = f"{tracker.run.run_id}: {tracker.status}"
            if watch is not None:
                line += f", attempt {watch.attempt} (job {watch.job_id}, {watch.state.value})"
            if self._last_lines.get(tracker.run.run_id) != line:
                self._last_lines[tracker.run.run_id] = line
                self.console.print(line, highlight=False, markup=False)
