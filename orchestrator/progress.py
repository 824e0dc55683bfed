"""Live progress of a drill: a table that redraws on a terminal, plain lines elsewhere."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live

from orchestrator.tables import Table
from orchestrator.tracker import RunTracker

REDRAW_INTERVAL_S = 0.25


def _table(trackers: list[RunTracker]) -> Table:
    table = Table(title="Faultdrill: drill in progress")
    for column in ("run", "status", "attempt", "job", "state", "step", "faults sent"):
        table.add_column(column)
    for tracker in trackers:
        watch = tracker.watch
        table.add_row(
            tracker.run.run_id, tracker.status, str(watch.attempt) if watch else "-", tracker.job_id or "-",
            watch.state.value if watch else "-", f"{watch.last_step if watch else 0}/{tracker.run.workload.steps}",
            f"{tracker.faults.sent}/{len(tracker.plan)}",
        )
    return table


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
