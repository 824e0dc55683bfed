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
STRATEGIES = ("resubmit", "requeue", "in-allocation", "warm", "elastic")
SPARE_STRATEGIES = ("in-allocation", "warm")  # a node failure takes a spare node
AUTO_INTERVALS = (0.5, 0.75, 1.0, 1.5, 2.0)  # x Daly's optimum at each scale, or the write's wait-free interval


@dataclass(frozen=True)
class Grid:
    gpus: tuple[int, ...] = (1024, 4096, 16384)
    gpus_per_node: int = 8
    days: float = 30.0
    strategies: tuple[str, ...] | None = None  # None: every strategy the drill measured
    spares: tuple[int, ...] = (0, 1, 4, 16)
    intervals_s: tuple[float, ...] | None = None  # None: auto_intervals at each scale
    state_bytes: float | None = None  # None: the drill's largest checkpoint
    replicas: int = 200
    seed: int = 0


@dataclass
class Row:
    gpus: int
    nodes: int
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
    notes: list[str] = field(default_factory=list)  # where it stands on other measurements than asked
    rows: list[Row] = field(default_factory=list)
    best: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"failure_model": self.failure_model, "assumptions": self.assumptions, "measured": self.measured,
                "notes": self.notes, "rows": [asdict(row) for row in self.rows], "best": self.best}


def project(measured: Measured, model: FailureModel, grid: Grid, assumptions: Assumptions) -> Projection:
    strategies = [s for s in (grid.strategies or sorted(measured.recoveries)) if s in measured.recoveries]
    unknown = sorted(set(grid.strategies or ()) - set(measured.recoveries))
    if unknown:
        raise ValueError(f"--strategies: {', '.join(unknown)} not measured in {measured.workdir} "
                         f"(measured: {', '.join(sorted(measured.recoveries))})")
    state_bytes = grid.state_bytes if grid.state_bytes is not None else measured.largest_bytes
    checkpoint_s = measured.checkpoint_s(state_bytes)  # its blocking: an asynchronous one's wait is per interval
    fitted, written = measured.checkpoint, measured.persist
    projection = Projection(
        notes=[*measured.notes, *fallback_notes(measured, model, strategies), *_checkpoint_notes(measured, state_bytes),
               *queue_notes(measured, strategies, assumptions)],
        failure_model={"name": model.name, "source": model.source, "node_share": model.node_share,
                       "causes": [{"name": cause.name, "share": cause.count / sum(c.count for c in model.causes),
                                   "takes_node": cause.takes_node, "failure_class": cause.failure_class.value}
                                  for cause in model.causes]},
        assumptions=assumptions.listed(),
        measured={"workdir": str(measured.workdir), "drill_gpus": measured.drill_gpus,
                  "recoveries": {s: len(rows) for s, rows in measured.recoveries.items()},
                  "checkpoint_fixed_s": fitted.fixed_s if fitted else None,
                  "checkpoint_bytes_per_s": fitted.bytes_per_s if fitted else None,
                  "persist_bytes_per_s": written.bytes_per_s if written else None,
                  "checkpoint_given_s": measured.given_checkpoint_s,
                  "state_bytes": state_bytes,
                  "checkpoint_s": checkpoint_s})
    cells: list[tuple[int, str, int, float]] = []
    scenarios: list[Scenario] = []
    mttfs = {gpus: model.mttf_h(gpus) * 3600 for gpus in grid.gpus}
    for gpus, mttf_s in mttfs.items():
        intervals = grid.intervals_s or auto_intervals(measured, state_bytes, checkpoint_s, mttf_s)
        for strategy in strategies:
            for spares in (grid.spares if strategy in SPARE_STRATEGIES else (0,)):
                for interval in intervals:
                    cells.append((gpus, strategy, spares, interval))
                    scenarios.append(scenario_for(strategy, measured, model, gpus, spares, interval,
                                                  measured.checkpoint_s(state_bytes, interval), grid.days * 86400,
                                                  assumptions))
    outcomes = simulate_many(scenarios, grid.replicas, np.random.default_rng(grid.seed))  # the whole grid at once
    projection.rows = [_row(*cell, outcome, grid.gpus_per_node) for cell, outcome in zip(cells, outcomes, strict=True)]
    for gpus, mttf_s in mttfs.items():
        projection.best += _best(projection.rows, gpus, checkpoint_s, mttf_s)
    projection.notes += edge_notes(projection.rows, projection.best)
    return projection


def auto_intervals(measured: Measured, state_bytes: float, checkpoint_s: float, mttf_s: float) -> tuple[float, ...]:
    """The intervals tried where none are given: around Daly's optimum for the checkpoint's blocking
    time, or around the shortest interval that no longer waits for the asynchronous write before it
    where that is longer (the write's time less the blocking: ``Measured.checkpoint_s``), for below
    it every checkpoint waits and the optimum lies past it, not at Daly's."""
    write_s = measured.persist.blocking_s(state_bytes) if measured.given_checkpoint_s is None and measured.persist else 0.0
    centre = max(daly_interval_s(max(checkpoint_s, 1e-3), mttf_s), write_s - checkpoint_s)
    return tuple(factor * centre for factor in AUTO_INTERVALS)


def edge_notes(rows: list[Row], best: list[dict[str, Any]]) -> list[str]:
    """A best interval at the longest or shortest one tried: the optimum may lie beyond the grid."""
    notes = []
    for top in best:
        tried = sorted({row.interval_s for row in rows if row.gpus == top["gpus"] and row.strategy == top["strategy"]})
        if len(tried) < 2 or tried[0] < top["interval_s"] < tried[-1]:
            continue
        side, way = ("longest", "longer") if top["interval_s"] == tried[-1] else ("shortest", "shorter")
        notes.append(f"at {top['gpus']} GPUs, {top['strategy']}'s best interval is the {side} tried "
                     f"({top['interval_s']:.0f} s): the best may be {way} still (--interval with {way} ones)")
    return notes


def scenario_for(strategy: str, measured: Measured, model: FailureModel, gpus: int, spares: int, interval_s: float,
                 checkpoint_s: float, solve_s: float, assumptions: Assumptions) -> Scenario:
    grown = assumptions.startup_per_doubling_s * max(0.0, float(np.log2(gpus / max(measured.drill_gpus, 1))))
    process_classes, node_classes = model.class_shares(False), model.class_shares(True)
    new_job = _recovery(measured, new_job_source(measured, strategy), None, grown, assumptions.queue_wait_s)
    common = {"solve_s": solve_s, "mttf_s": model.mttf_h(gpus) * 3600, "interval_s": interval_s,
              "checkpoint_s": checkpoint_s, "node_share": model.node_share, "repair_s": assumptions.repair_h * 3600}
    if strategy in NEW_JOB_STRATEGIES:
        # requeue's measured queue is the scheduler's hold of a requeued job, which the wait adds to
        own = _recovery(measured, strategy, None, grown, assumptions.queue_wait_s, on_top=strategy == "requeue")
        return Scenario(process=own, new_job=own, **common)  # type: ignore[arg-type]  # common's values are Scenario's
    # warm answers what its coordinator saw (a rank's death) with a spare, a job found hung from
    # outside with a new job (orchestrator/strategies/warm.py)
    hung = process_classes.get("HANG", 0.0) if strategy == "warm" else 0.0
    process = _recovery(measured, strategy, process_classes, grown, None)
    node = _recovery(measured, strategy, node_classes, grown, None) if spares and strategy in SPARE_STRATEGIES else None
    return Scenario(process=process, new_job=new_job, node=node, spares=spares if node is not None else 0,
                    process_new_job_share=hung, **common)


def new_job_source(measured: Measured, strategy: str) -> str:
    """Whose measured recoveries stand for a new job: resubmit's, else another strategy's that
    starts cold (requeue, in-allocation, elastic), else the strategy's own (a note says so)."""
    for source in ("resubmit", "requeue", "in-allocation", "elastic"):
        if source in measured.recoveries:
            return source
    return strategy


def _recovery(measured: Measured, strategy: str, classes: dict[str, float] | None, startup_grown_s: float,
              queue_wait_s: float | None, on_top: bool = False) -> Recovery:
    """The measured recoveries, grown to the scale; those that took a survivor's state keep the
    work (their measured lost work re-done), the others roll back to the checkpoint. A new job
    waits ``queue_wait_s`` in the queue (the assumption replaces what the drill's small, idle
    cluster measured; ``on_top``: added to it); None: a restart in place keeps its measured queue."""
    rows = measured.chosen(strategy, classes)
    phases = np.array([row.phases for row in rows], dtype=float)
    phases[:, PHASES.index("startup_s")] += startup_grown_s
    if queue_wait_s is not None:
        queue = PHASES.index("queue_s")
        phases[:, queue] = queue_wait_s + (phases[:, queue] if on_top else 0.0)
    if not any(row.keeps_work for row in rows):
        return Recovery(phases)
    return Recovery(phases, True, np.array([row.lost_s if row.keeps_work else np.inf for row in rows]))


def fallback_notes(measured: Measured, model: FailureModel, strategies: list[str]) -> list[str]:
    """Where the projection stands on other measurements than the ones it asks for."""
    notes = []
    for strategy in strategies:
        if strategy not in NEW_JOB_STRATEGIES and new_job_source(measured, strategy) == strategy:
            notes.append(f"{strategy}: no strategy that starts a new job was measured; a new job is taken as "
                         f"{strategy}'s own recovery plus the queue wait (drill resubmit beside it)")
        for takes_node, what in ((False, "process"), (True, "node")):
            measured_classes = {row.failure_class for row in measured.recoveries[strategy]}
            missing = sorted(set(model.class_shares(takes_node)) - measured_classes)
            if missing:
                notes.append(f"{strategy}: no {', '.join(missing)} recovery measured; {what} failures of "
                             f"{'that class' if len(missing) == 1 else 'those classes'} take {strategy}'s others")
    return notes


def _checkpoint_notes(measured: Measured, state_bytes: float) -> list[str]:
    if measured.persist is None or measured.given_checkpoint_s is not None:
        return []
    return [f"the drill's checkpoints were written in the background: at the state size asked a checkpoint blocks "
            f"{measured.checkpoint_s(state_bytes):.3g} s and is written in {measured.persist.blocking_s(state_bytes):.3g} s; "
            "the next waits for it where the interval is shorter (counted), and a failure before it is written rolls "
            "back one interval further (not counted)"]


def queue_notes(measured: Measured, strategies: list[str], assumptions: Assumptions) -> list[str]:
    """What the queue wait of a new job stands on: the assumption, not the drill's idle cluster."""
    measured_queue = [row.phases[PHASES.index("queue_s")] for strategy in strategies if strategy != "requeue"
                      for row in measured.recoveries.get(new_job_source(measured, strategy), [])]
    if not measured_queue:
        return []
    return [f"a new job waits {assumptions.queue_wait_s:g} s for its nodes (--queue-wait-s), in place of the drill's "
            f"measured queue (median {float(np.median(measured_queue)):.2f} s on its own cluster)"]


def _row(gpus: int, strategy: str, spares: int, interval_s: float, outcome: Outcome, gpus_per_node: int) -> Row:
    goodput = outcome.goodput
    lost = {phase: float(outcome.restart_phases_s[index] / 3600) for index, phase in enumerate(PHASES)}
    lost |= {"rework": float(outcome.rework_s.mean() / 3600), "checkpoints": float(outcome.checkpoint_s.mean() / 3600)}
    return Row(gpus, -(-gpus // gpus_per_node), strategy, spares, float(interval_s), float(goodput.mean()),
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
