"""``faultdrill project``: a drill's measurements carried to the job's real scale (issue 25).

For each scale (GPUs), restart strategy the drill measured, number of spare nodes and checkpoint
interval, the long job is simulated (orchestrator/project/simulate.py) with:

- its failures from the failure model (orchestrator/project/failure_models.py): the MTTF at that
  scale, the share that takes a node, the classes (which of the drill's recoveries stand for them);
- its recoveries resampled from the drill's own (orchestrator/project/measured.py), with what a
  small cluster cannot measure added as named assumptions (``Assumptions``, each printed with its
  value and source): a new job's queue wait, the start-up's growth with the ranks, a node's repair;
- its checkpoint cost from the drill's blocking times against their size, at the state size asked.

Strategies as the code does them: ``resubmit`` and ``requeue`` answer every failure with a new job
(the queue wait added); ``in-allocation`` relaunches in place, a node failure taking a spare node
(without one, the job ends: a new job); ``warm`` answers with a spare's recovery (a survivor's
state: the work is kept), a node failure taking a spare node (without one: a new job, from the
checkpoint).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from orchestrator.project.assumptions import Assumptions
from orchestrator.project.failure_models import FailureModel
from orchestrator.project.measured import Measured
from orchestrator.project.simulate import (
    PHASES,
    Outcome,
    Recovery,
    Scenario,
    daly_interval_s,
    simulate_many,
    young_interval_s,
)

NEW_JOB_STRATEGIES = ("resubmit", "requeue")  # every failure: a new job
SPARE_STRATEGIES = ("in-allocation", "warm")  # a node failure takes a spare node
AUTO_INTERVALS = (0.5, 0.75, 1.0, 1.5, 2.0)  # x Daly's optimum at each scale


@dataclass(frozen=True)
class Grid:
    gpus: tuple[int, ...] = (1024, 4096, 16384)
    gpus_per_node: int = 8
    days: float = 30.0
    strategies: tuple[str, ...] | None = None  # None: every strategy the drill measured
    spares: tuple[int, ...] = (0, 1, 4, 16)
    intervals_s: tuple[float, ...] | None = None  # None: around Daly's optimum at each scale
    state_bytes: float | None = None  # None: the drill's largest checkpoint
    replicas: int = 200
    seed: int = 0


@dataclass
class Row:
    gpus: int
    strategy: str
    spares: int
    interval_s: float
    goodput: float
    goodput_ci95: float
    failures: float
    new_jobs: float
    lost_h: dict[str, float]  # mean hours per cause: each restart phase, rework, checkpoints


@dataclass
class Projection:
    failure_model: dict[str, Any]
    assumptions: list[dict[str, Any]]
    measured: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    best: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"failure_model": self.failure_model, "assumptions": self.assumptions, "measured": self.measured,
                "rows": [asdict(row) for row in self.rows], "best": self.best}


def project(measured: Measured, model: FailureModel, grid: Grid, assumptions: Assumptions) -> Projection:
    strategies = [s for s in (grid.strategies or sorted(measured.recoveries)) if s in measured.recoveries]
    unknown = sorted(set(grid.strategies or ()) - set(measured.recoveries))
    if unknown:
        raise ValueError(f"--strategies: {', '.join(unknown)} not measured in {measured.workdir} "
                         f"(measured: {', '.join(sorted(measured.recoveries))})")
    state_bytes = grid.state_bytes if grid.state_bytes is not None else measured.checkpoint.largest_bytes
    checkpoint_s = measured.checkpoint.blocking_s(state_bytes)
    projection = Projection(
        failure_model={"name": model.name, "source": model.source, "node_share": model.node_share},
        assumptions=assumptions.listed(),
        measured={"workdir": str(measured.workdir), "drill_gpus": measured.drill_gpus,
                  "recoveries": {s: len(rows) for s, rows in measured.recoveries.items()},
                  "checkpoint_fixed_s": measured.checkpoint.fixed_s,
                  "checkpoint_bytes_per_s": measured.checkpoint.bytes_per_s, "state_bytes": state_bytes,
                  "checkpoint_s": checkpoint_s})
    cells: list[tuple[int, str, int, float]] = []
    scenarios: list[Scenario] = []
    mttfs = {gpus: model.mttf_h(gpus) * 3600 for gpus in grid.gpus}
    for gpus, mttf_s in mttfs.items():
        intervals = grid.intervals_s or tuple(f * daly_interval_s(max(checkpoint_s, 1e-3), mttf_s) for f in AUTO_INTERVALS)
        for strategy in strategies:
            for spares in (grid.spares if strategy in SPARE_STRATEGIES else (0,)):
                for interval in intervals:
                    cells.append((gpus, strategy, spares, interval))
                    scenarios.append(scenario_for(strategy, measured, model, gpus, spares, interval, checkpoint_s,
                                                  grid.days * 86400, assumptions))
    outcomes = simulate_many(scenarios, grid.replicas, np.random.default_rng(grid.seed))  # the whole grid at once
    projection.rows = [_row(*cell, outcome) for cell, outcome in zip(cells, outcomes, strict=True)]
    for gpus, mttf_s in mttfs.items():
        projection.best += _best(projection.rows, gpus, checkpoint_s, mttf_s)
    return projection


def scenario_for(strategy: str, measured: Measured, model: FailureModel, gpus: int, spares: int, interval_s: float,
                 checkpoint_s: float, solve_s: float, assumptions: Assumptions) -> Scenario:
    grown = assumptions.startup_per_doubling_s * max(0.0, float(np.log2(gpus / max(measured.drill_gpus, 1))))
    process_classes, node_classes = model.class_shares(False), model.class_shares(True)
    new_job_source = "resubmit" if "resubmit" in measured.recoveries else strategy
    new_job = _recovery(measured, new_job_source, None, grown, assumptions.queue_wait_s, keeps_work=False)
    if strategy in NEW_JOB_STRATEGIES:
        own = _recovery(measured, strategy, None, grown, assumptions.queue_wait_s, keeps_work=False)
        return Scenario(solve_s, model.mttf_h(gpus) * 3600, interval_s, checkpoint_s, own, own,
                        node=None, node_share=model.node_share, spares=0, repair_s=assumptions.repair_h * 3600)
    keeps = strategy == "warm" and _mostly_peer(measured, strategy)
    process = _recovery(measured, strategy, process_classes, grown, 0.0, keeps_work=keeps)
    node = _recovery(measured, strategy, node_classes, grown, 0.0, keeps_work=keeps) if spares else None
    return Scenario(solve_s, model.mttf_h(gpus) * 3600, interval_s, checkpoint_s, process, new_job, node=node,
                    node_share=model.node_share, spares=spares, repair_s=assumptions.repair_h * 3600)


def _recovery(measured: Measured, strategy: str, classes: dict[str, float] | None, startup_grown_s: float,
              queue_wait_s: float, keeps_work: bool) -> Recovery:
    rows = measured.chosen(strategy, classes)
    phases = np.array([row.phases for row in rows], dtype=float)
    phases[:, PHASES.index("startup_s")] += startup_grown_s
    phases[:, PHASES.index("queue_s")] += queue_wait_s
    lost = np.array([row.lost_s for row in rows]) if keeps_work else None
    return Recovery(phases, keeps_work, lost)


def _mostly_peer(measured: Measured, strategy: str) -> bool:
    rows = measured.recoveries[strategy]
    return sum(row.keeps_work for row in rows) * 2 > len(rows)


def _row(gpus: int, strategy: str, spares: int, interval_s: float, outcome: Outcome) -> Row:
    goodput = outcome.goodput
    lost = {phase: float(outcome.restart_phases_s[index] / 3600) for index, phase in enumerate(PHASES)}
    lost |= {"rework": float(outcome.rework_s.mean() / 3600), "checkpoints": float(outcome.checkpoint_s.mean() / 3600)}
    return Row(gpus, strategy, spares, float(interval_s), float(goodput.mean()),
               float(1.96 * goodput.std(ddof=1) / np.sqrt(goodput.size)) if goodput.size > 1 else 0.0,
               float(outcome.failures.mean()), float(outcome.new_jobs.mean()), lost)


def _best(rows: list[Row], gpus: int, checkpoint_s: float, mttf_s: float) -> list[dict[str, Any]]:
    """Per strategy at this scale: the best interval and spare count, beside Young's and Daly's."""
    best = []
    for strategy in sorted({row.strategy for row in rows if row.gpus == gpus}):
        mine = [row for row in rows if row.gpus == gpus and row.strategy == strategy]
        top = max(mine, key=lambda row: row.goodput)
        best.append({"gpus": gpus, "strategy": strategy, "goodput": top.goodput, "interval_s": top.interval_s,
                     "spares": top.spares, "young_interval_s": young_interval_s(checkpoint_s, mttf_s),
                     "daly_interval_s": daly_interval_s(max(checkpoint_s, 1e-3), mttf_s), "mttf_h": mttf_s / 3600})
    return best
