"""What a drill measured that a projection needs (issue 25), read from its workdir: the drill's
report (orchestrator/report/document.py) over a snapshot of its ledger (the drill's files are never
written: a read-only or an older version's workdir reads as it stands).

- Recoveries, per restart strategy: each recovery's phases (detection to first step), its failure
  class, the work it re-did and where its state came from (``peer``: a survivor's, no rollback).
  A projection resamples them (empirical distributions, never a fitted guess). Left out, and said:
  the recoveries of a run whose own records contradict its faults (the report's findings: a kill
  that hit a launcher while the ranks trained on), and those whose phases span a node clock that was
  not read (not on one clock). Kept, and said: phases below their clocks' uncertainty, and the
  inferred phases of a user's own script (zero-code: from its logs).
- The checkpoint's cost against its size: ``blocking = fixed + bytes / bandwidth``, least squares
  over every checkpoint the drill wrote (non-negative terms; proportional to the size where the
  sizes cannot say more), extrapolated to the state size asked; the same for its persist (an
  asynchronous checkpoint's write): the next checkpoint waits for the one still being written. A
  user's own script's checkpoints are not the drill's to time: ``--checkpoint-s`` gives their cost.
- The drill's own scale (GPUs, or ranks where it had none) and its step time.

A workdir whose drill recovered from nothing cannot be projected: ``MissingMeasurements`` names
what is missing and the campaign that measures it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.project.simulate import PHASES
from orchestrator.record.effects import INEFFECTIVE
from orchestrator.record.ledger_home import has_ledger
from orchestrator.record.ledger_snapshot import LedgerUnreadable, ledger_snapshot
from orchestrator.report.document import build_report

PEER = "peer"
ASYNC_PERSIST_X = 1.5  # a checkpoint whose write outlasts its blocking this much was written in the background


class MissingMeasurements(ValueError):
    """The workdir lacks what a projection is built from: what, and how to measure it."""


@dataclass(frozen=True)
class MeasuredRecovery:
    phases: tuple[float, ...]  # one per PHASES
    failure_class: str
    lost_s: float
    keeps_work: bool  # resumed from a survivor's state (warm), not from the checkpoint


@dataclass(frozen=True)
class CheckpointCost:
    """``seconds(bytes) = fixed_s + bytes / bytes_per_s`` fitted to the drill's checkpoints."""

    fixed_s: float
    bytes_per_s: float
    points: int
    largest_bytes: int

    def blocking_s(self, size_bytes: float) -> float:
        return self.fixed_s + size_bytes / self.bytes_per_s


@dataclass(frozen=True)
class Measured:
    workdir: Path
    recoveries: dict[str, list[MeasuredRecovery]]  # strategy -> its recoveries
    checkpoint: CheckpointCost | None  # the blocking time's fit (None: --checkpoint-s given instead)
    drill_gpus: int  # the largest run's GPUs (ranks where it had none)
    step_s: float | None
    persist: CheckpointCost | None = None  # the write's fit, where the drill's checkpoints were asynchronous
    given_checkpoint_s: float | None = None  # --checkpoint-s: the user's own figure at the state size asked
    notes: list[str] = field(default_factory=list)  # what was left out or inferred, and why
    largest_bytes: int = 0

    def chosen(self, strategy: str, classes: dict[str, float] | None = None) -> list[MeasuredRecovery]:
        """The strategy's recoveries of ``classes`` (a failure model's mix) where the drill
        measured any, else all of them."""
        rows = self.recoveries[strategy]
        return [row for row in rows if classes is None or row.failure_class in classes] or rows

    def checkpoint_s(self, state_bytes: float, interval_s: float | None = None) -> float:
        """What one checkpoint holds training up at ``state_bytes``: its blocking time, and where the
        drill wrote asynchronously, the wait for the one before still being written when the next
        is due ``interval_s`` later (none where no interval is given)."""
        if self.given_checkpoint_s is not None:
            return self.given_checkpoint_s
        assert self.checkpoint is not None  # read_measured gives one or the other
        blocking = self.checkpoint.blocking_s(state_bytes)
        if self.persist is None or interval_s is None:
            return blocking
        return blocking + max(0.0, self.persist.blocking_s(state_bytes) - blocking - interval_s)


def read_measured(workdir: Path, checkpoint_s: float | None = None) -> Measured:
    """The drill's measurements; ``checkpoint_s``: the user's own checkpoint cost at the state size
    asked (a script whose checkpoints the drill does not write), instead of the drill's."""
    workdir = workdir.resolve()
    if not has_ledger(workdir):
        raise MissingMeasurements(f"{workdir}: no ledger.sqlite here; is this a campaign workdir?")
    try:
        with ledger_snapshot(workdir) as ledger:
            report = build_report(workdir, ledger)
            records = {run["run_id"]: ledger.checkpoints(run["run_id"]) for run in report["runs"]}
            resources = {row.run_id: json.loads(row.config).get("resources", {}) for row in ledger.runs()}
            finished = ledger.meta("finished") is not None
    except LedgerUnreadable as error:
        raise MissingMeasurements(str(error)) from None
    book = _RecoveryBook()
    gpus, step_times, zero_code = 1, [], []
    for run in report["runs"]:
        asked = resources.get(run["run_id"], {})
        gpus = max(gpus, run["ranks"], int(asked.get("nodes", 1)) * int(asked.get("gpus_per_node") or 0))
        if run["step_time_s"]:
            step_times.append(run["step_time_s"])
        if run["progress"]["inferred"] and run["recoveries"]:
            zero_code.append(run["run_id"])
        book.add(run)
    points = [(r.bytes, r.blocking_s, r.persist_s) for rows in records.values() for r in rows
              if r.bytes > 0 and r.blocking_s > 0]  # 0: a record that measured none
    _refuse_if_missing(workdir, book, points, checkpoint_s)
    notes = book.notes() + _scope_notes(report, finished, zero_code, points, checkpoint_s)
    blocking = fit_checkpoint_cost([(size, seconds) for size, seconds, _ in points]) if points else None
    return Measured(workdir, book.recoveries, None if checkpoint_s is not None else blocking, gpus,
                    float(np.median(step_times)) if step_times else None, persist=_persist_fit(points),
                    given_checkpoint_s=checkpoint_s, notes=notes,
                    largest_bytes=max((size for size, _, _ in points), default=0))


class _RecoveryBook:
    """The recoveries a projection may resample, and how many were left out or flagged, and why."""

    def __init__(self) -> None:
        self.recoveries: dict[str, list[MeasuredRecovery]] = {}
        self.contradicted: list[str] = []  # runs whose records contradict their faults
        self.off_clock = 0  # recoveries across a node clock that was not read
        self.below_uncertainty = 0

    def add(self, run: dict[str, Any]) -> None:
        ineffective = ineffective_faults(run)
        if ineffective is None:
            self.contradicted.append(run["run_id"])
            return
        for row in run["recoveries"]:
            if row["fault_at"] in ineffective:  # that fault did not act as the drill says it did
                self.contradicted.append(f"{run['run_id']} (a {row['fault_kind']})")
                continue
            if row["clocks_not_read"]:
                self.off_clock += 1
                continue
            self.below_uncertainty += bool(row["below_uncertainty"])
            self.recoveries.setdefault(run["strategy"], []).append(MeasuredRecovery(
                tuple(float(row[phase]) for phase in PHASES), row["failure_class"] or "UNKNOWN",
                float(row["lost_s"]), row.get("state_source") == PEER))

    def notes(self) -> list[str]:
        notes = []
        if self.contradicted:
            notes.append(f"left out: the recoveries of {', '.join(self.contradicted)}, whose faults the ranks' own "
                         "records say were ineffective (the report's findings: faultdrill report WORKDIR)")
        if self.off_clock:
            notes.append(f"left out: {self.off_clock} recoveries whose phases span a node clock that was not read "
                         "(not on one clock)")
        if self.below_uncertainty:
            notes.append(f"{self.below_uncertainty} recoveries have phases shorter than their clocks' uncertainty "
                         "(kept as measured: the report marks them <=)")
        return notes


def ineffective_faults(run: dict[str, Any]) -> set[float] | None:
    """The moments of the run's faults that its ranks' records say were ineffective (the report's
    INEFFECTIVE findings: a kill that hit a launcher while its ranks trained on); None where a
    finding names no fault (the whole run is not to be believed). A suspicious record (ranks slow to
    exit after their final record) leaves the recoveries as measured."""
    moments: set[float] = set()
    for finding in run["findings"]:
        if finding["verdict"] != INEFFECTIVE:
            continue
        if finding["fault"] is None:
            return None
        moments.add(run["faults"][finding["fault"]]["at"])
    return moments


def _refuse_if_missing(workdir: Path, book: _RecoveryBook, points: list[tuple[int, float, float]],
                       checkpoint_s: float | None) -> None:
    missing = []
    if not book.recoveries:
        why = "; ".join(book.notes())
        missing.append("no recovery was measured (no run failed and came back" + (f"; {why}" if why else "")
                       + "), so none of a restart's phases is known (detection, resubmission, queue, start-up, "
                       "checkpoint load, first step) nor the work a failure loses: drill faults first, e.g. "
                       "experiments/campaigns/strategies.yaml (every restart strategy, each failure class)")
    if not points and checkpoint_s is None:
        missing.append("no checkpoint was timed by the drill (a built-in workload's checkpoint.every_steps, or the "
                       "rank API's save, times them; a script's own are not the drill's): give --checkpoint-s, your "
                       "checkpoint's blocking time at --state-gb")
    if missing:
        raise MissingMeasurements(f"{workdir}: cannot project: " + "; ".join(missing))


def _scope_notes(report: dict[str, Any], finished: bool, zero_code: list[str],
                 points: list[tuple[int, float, float]], checkpoint_s: float | None) -> list[str]:
    notes = []
    if not finished:
        open_runs = [run["run_id"] for run in report["runs"] if run["status"] in ("pending", "running")]
        notes.append("the drill had not finished (it still runs, or its controller was stopped): what it recorded "
                     f"so far is projected ({len(open_runs)} runs not ended)")
    if zero_code:
        timed = "--checkpoint-s" if checkpoint_s is not None else (
            "the checkpoints the drill timed (of its built-in or rank-API runs)" if points else "nothing")
        notes.append(f"{', '.join(zero_code)}: the user's own script (zero-code): start-up, load, first step and lost "
                     f"work inferred from its logs; its checkpoints were not timed by the drill: the cost is {timed}")
    return notes


def _persist_fit(points: list[tuple[int, float, float]]) -> CheckpointCost | None:
    """The write's cost against size, where the drill's checkpoints were written in the background
    (their persist well past their blocking); None for synchronous ones."""
    written = [(size, persist) for size, blocking, persist in points if persist > ASYNC_PERSIST_X * blocking]
    return fit_checkpoint_cost(written) if written and len(written) * 2 >= len(points) else None


def fit_checkpoint_cost(points: list[tuple[int, float]]) -> CheckpointCost:
    """Least squares of blocking time on size, both terms >= 0. Where the sizes cannot show how the
    cost grows (one size, or a fit whose cost falls with the size or starts below zero), the cost is
    taken as proportional to the size (the measured bandwidth): a larger state never costs less."""
    sizes = np.array([size for size, _ in points], dtype=float)
    seconds = np.array([blocking for _, blocking in points], dtype=float)
    largest = int(sizes.max())
    slope, fixed = np.polyfit(sizes, seconds, 1) if np.ptp(sizes) > 0 else (0.0, 0.0)
    if slope <= 0 or fixed < 0:  # through the origin
        slope, fixed = float(sizes @ seconds / (sizes @ sizes)), 0.0
    return CheckpointCost(float(fixed), float(1 / slope), len(points), largest)
