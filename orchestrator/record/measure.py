"""Facts the study needs that only the run's own files hold: model size, step time, and how far a
resumed run ended from its fault-free twin (largest weight difference, first divergent loss)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FRAMEWORK_READY,
    LossRecord,
    RunPaths,
    first_event,
    read_attempt_events,
    read_json_lines,
)
from orchestrator.campaign.runs import RunConfig
from orchestrator.record.ledger import Ledger
from orchestrator.record.outputs import MISSING, compare_outputs


def completion_facts(paths: RunPaths, attempt: int) -> dict[str, Any]:
    """Ledger columns from the final attempt's events: exact parameter count, step time, switches."""
    events = read_attempt_events(paths, attempt)
    ready = first_event(events, EVENT_FRAMEWORK_READY)
    completed = first_event(events, EVENT_COMPLETED)
    facts: dict[str, Any] = {}
    if ready is not None and "params" in ready.fields:
        facts["params"] = int(ready.fields["params"])
    if ready is not None and "determinism" in ready.fields:
        facts["determinism"] = str(ready.fields["determinism"])
    if completed is not None and "step_time_s" in completed.fields:
        facts["step_time_s"] = completed.number("step_time_s", 0.0)
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
    for record in map(LossRecord.from_json, read_json_lines(paths.loss_log)):
        if record.step not in losses or record.attempt >= losses[record.step][0]:
            losses[record.step] = (record.attempt, record.loss)
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
        if run.command is not None:
            _record_outputs(ledger, run, twin)
            continue
        ledger.update_run(
            run.run_id,
            max_abs_weight_diff=max_abs_weight_diff(run.paths.final_weights, twin.paths.final_weights),
            first_divergent_step=first_divergent_step(run.paths, twin.paths),
        )


def _record_outputs(ledger: Ledger, run: RunConfig, twin: RunConfig) -> None:
    """The user's script: its outputs against its twin's (nothing to compare without workload.outputs:
    the report says identity was not checked)."""
    if not run.outputs or run.command is None or twin.command is None:
        return
    verdict = compare_outputs(Path(run.command.cwd), Path(twin.command.cwd), run.outputs)
    ledger.update_run(run.run_id, outputs=json.dumps(verdict.to_json()),
                      max_abs_weight_diff=verdict.max_abs_diff if verdict.verdict != MISSING else None)
