"""Facts the study needs that only the run's own files hold: model size, step time, and how far a
resumed run ended from its fault-free twin (largest weight difference, first divergent loss)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments.layout import EVENT_COMPLETED, EVENT_FRAMEWORK_READY, RunPaths, read_json_lines
from orchestrator.campaign.runs import RunConfig
from orchestrator.record.ledger import Ledger
from orchestrator.record.recovery import first_event


def completion_facts(paths: RunPaths, attempt: int) -> dict[str, Any]:
    """Ledger columns from the final attempt's events: exact parameter count, step time, switches."""
    events = read_json_lines(paths.events_file(attempt))
    ready = first_event(events, EVENT_FRAMEWORK_READY) or {}
    completed = first_event(events, EVENT_COMPLETED) or {}
    facts: dict[str, Any] = {}
    if "params" in ready:
        facts["params"] = int(ready["params"])
    if "determinism" in ready:
        facts["determinism"] = str(ready["determinism"])
    if "step_time_s" in completed:
        facts["step_time_s"] = float(completed["step_time_s"])
    return facts


def max_abs_weight_diff(first: Path, second: Path) -> float | None:
    """Largest absolute difference between same-named weights; None if either file is missing."""
    if not first.exists() or not second.exists():
        return None
    with np.load(first) as a, np.load(second) as b:
        if set(a.files) != set(b.files):
            return float("inf")
        diffs = [float(np.max(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)), initial=0.0))
                 for name in a.files]
    return max(diffs, default=0.0)


def final_losses(paths: RunPaths) -> dict[int, float]:
    """Loss per step as the run finally went: a resumed attempt's steps replace the lost ones."""
    losses: dict[int, tuple[int, float]] = {}
    for record in read_json_lines(paths.loss_log):
        step, attempt = int(record["step"]), int(record["attempt"])
        if step not in losses or attempt >= losses[step][0]:
            losses[step] = (attempt, float(record["loss"]))
    return {step: loss for step, (_, loss) in losses.items()}


def first_divergent_step(run: RunPaths, twin: RunPaths) -> int | None:
    mine, theirs = final_losses(run), final_losses(twin)
    return next((step for step in sorted(mine) if step in theirs and mine[step] != theirs[step]), None)


def record_determinism(ledger: Ledger, runs: list[RunConfig]) -> None:
    """For every completed run with a completed twin: how far apart they ended."""
    by_id = {run.run_id: run for run in runs}
    status = {row.run_id: row.status for row in ledger.runs()}
    for run in (run for run in runs if run.twin in by_id):
        twin = by_id[run.twin or ""]
        if status.get(run.run_id) != "completed" or status.get(twin.run_id) != "completed":
            continue
        ledger.update_run(
            run.run_id,
            max_abs_weight_diff=max_abs_weight_diff(run.paths.final_weights, twin.paths.final_weights),
            first_divergent_step=first_divergent_step(run.paths, twin.paths),
        )
