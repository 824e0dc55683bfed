"""What a drill measured that a projection needs (issue 25), read from its workdir's ledger.

- Recoveries, per restart strategy: each recovery's phases (detection to first step), its failure
  class, the work it re-did and where its state came from (``peer``: a survivor's, no rollback).
  A projection resamples them (empirical distributions, never a fitted guess).
- The checkpoint's cost against its size: ``blocking = fixed + bytes / bandwidth``, least squares
  over every checkpoint the drill wrote (non-negative terms; proportional to the size where the
  sizes cannot say more), extrapolated to the state size asked.
- The drill's own scale (GPUs, or ranks where it had none) and its step time.

A workdir whose drill recovered from nothing cannot be projected: ``MissingMeasurements`` names
what is missing and the campaign that measures it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.project.simulate import PHASES
from orchestrator.record.ledger import Ledger
from orchestrator.record.ledger_home import has_ledger

PEER = "peer"


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
    """``blocking_s(bytes) = fixed_s + bytes / bytes_per_s`` fitted to the drill's checkpoints."""

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
    checkpoint: CheckpointCost
    drill_gpus: int  # the largest run's GPUs (ranks where it had none)
    step_s: float | None

    def chosen(self, strategy: str, classes: dict[str, float] | None = None) -> list[MeasuredRecovery]:
        """The strategy's recoveries of ``classes`` (a failure model's mix) where the drill
        measured any, else all of them."""
        rows = self.recoveries[strategy]
        return [row for row in rows if classes is None or row.failure_class in classes] or rows


def read_measured(workdir: Path) -> Measured:
    if not has_ledger(workdir):
        raise MissingMeasurements(f"{workdir}: no ledger.sqlite here; is this a campaign workdir?")
    ledger = Ledger.in_workdir(workdir)
    try:
        runs = ledger.runs()
        recoveries: dict[str, list[MeasuredRecovery]] = {}
        points: list[tuple[int, float]] = []
        gpus, step_times = 1, []
        for run in runs:
            config = json.loads(run.config)
            resources = config.get("resources", {})
            gpus = max(gpus, run.ranks, int(resources.get("nodes", 1)) * int(resources.get("gpus_per_node") or 0))
            if run.step_time_s:
                step_times.append(run.step_time_s)
            for row in ledger.recoveries(run.run_id):
                recoveries.setdefault(run.strategy, []).append(MeasuredRecovery(
                    tuple(float(getattr(row, phase)) for phase in PHASES), row.failure_class or "UNKNOWN",
                    float(row.lost_s), row.state_source == PEER))
            points += [(record.bytes, record.blocking_s) for record in ledger.checkpoints(run.run_id)
                       if record.bytes > 0 and record.blocking_s > 0]  # 0: a record that measured none
    finally:
        ledger.close()
    missing = []
    if not recoveries:
        missing.append("no recovery was measured (no run failed and came back): drill faults first, e.g. "
                       "experiments/campaigns/strategies.yaml (every restart strategy, each failure class)")
    if not points:
        missing.append("no checkpoint was written: a run needs checkpoint.every_steps (the checkpoint's cost at "
                       "scale is fitted to them)")
    if missing:
        raise MissingMeasurements(f"{workdir}: cannot project: " + "; ".join(missing))
    return Measured(workdir, recoveries, fit_checkpoint_cost(points), gpus,
                    float(np.median(step_times)) if step_times else None)


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
