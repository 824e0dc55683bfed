"""The checkpoint study of arXiv 2012.00825, plus time to recover: one table per dimension, with
the frameworks side by side. Built from the per-run report, so it is the same in JSON and tables.

- cost: blocking and persist time per checkpoint, and their share of one training step;
- format_size: format, files, writers, bytes per checkpoint against the raw parameter bytes;
- scale: checkpoint time and size against the number of ranks;
- determinism: does a run resumed after a fault end bitwise equal to its fault-free twin;
- recovery: time to recover after a fault, phase by phase, and the work lost.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Callable, Iterable

PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s")


def _completed(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs if run["status"] == "completed" and run["checkpoints"]["count"] > 0]


def _mean(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.fmean(present) if present else None


def _grouped(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[Any, ...]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[key(run)].append(run)
    return dict(sorted(groups.items(), key=lambda item: tuple(str(part) for part in item[0])))


def cost_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (framework, model, params, ranks), group in _grouped(
        _completed(runs), lambda r: (r["framework"], r["model"], r["params"], r["ranks"])
    ).items():
        rows.append({
            "framework": framework, "model": model, "params": params, "ranks": ranks,
            "step_time_s": _mean(r["step_time_s"] for r in group),
            "blocking_s": _mean(r["checkpoints"]["mean_blocking_s"] for r in group),
            "persist_s": _mean(r["checkpoints"]["mean_persist_s"] for r in group),
            "blocking_share_of_step": _mean(r["checkpoints"]["blocking_share_of_step"] for r in group),
            "persist_share_of_step": _mean(r["checkpoints"]["persist_share_of_step"] for r in group),
        })
    return rows


def format_size_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (framework, model, params), group in _grouped(
        _completed(runs), lambda r: (r["framework"], r["model"], r["params"])
    ).items():
        checkpoint = group[0]["checkpoints"]
        rows.append({
            "framework": framework, "model": model, "params": params, "format": checkpoint["format"],
            "files_per_checkpoint": checkpoint["files_per_checkpoint"], "writers": checkpoint["writers"],
            "bytes": checkpoint["bytes"], "raw_param_bytes": checkpoint["raw_param_bytes"],
            "overhead_vs_raw": checkpoint["overhead_vs_raw"],
        })
    return rows


def scale_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (framework, model, params, ranks, nodes), group in _grouped(
        _completed(runs), lambda r: (r["framework"], r["model"], r["params"], r["ranks"], r["nodes"])
    ).items():
        rows.append({
            "framework": framework, "model": model, "params": params, "ranks": ranks, "nodes": nodes,
            "blocking_s": _mean(r["checkpoints"]["mean_blocking_s"] for r in group),
            "persist_s": _mean(r["checkpoints"]["mean_persist_s"] for r in group),
            "bytes": group[0]["checkpoints"]["bytes"],
            "files_per_checkpoint": group[0]["checkpoints"]["files_per_checkpoint"],
        })
    return rows


def determinism_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "framework": run["framework"], "model": run["model"], "ranks": run["ranks"], "run_id": run["run_id"],
            "resumed_from_step": next(rec["resumed_from_step"] for rec in run["recoveries"] if rec["resumed_from_step"]),
            "recoveries": len(run["recoveries"]),
            "identical_to_baseline": run["identical_to_baseline"],
            "max_abs_weight_diff": run["max_abs_weight_diff"],
            "first_divergent_step": run["first_divergent_step"],
            "switches": run["determinism_switches"],
            "compared": "digest" if run["baseline_digest"] is not None else "outputs",
        }
        for run in runs
        if (run["baseline_digest"] is not None or _outputs_compared(run)) and run["resumed"]
    ]


def _outputs_compared(run: dict[str, Any]) -> bool:
    """The user's script: its outputs were compared with its twin's (workload.outputs)."""
    outputs = run.get("outputs") or {}
    return outputs.get("verdict") is not None


def recovery_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (framework, model, ranks), group in _grouped(
        [run for run in runs if run["recoveries"]], lambda r: (r["framework"], r["model"], r["ranks"])
    ).items():
        recoveries = [rec for run in group for rec in run["recoveries"]]
        row: dict[str, Any] = {"framework": framework, "model": model, "ranks": ranks, "recoveries": len(recoveries)}
        row.update({phase: _mean(rec[phase] for rec in recoveries) for phase in PHASES})
        row["lost_steps"] = _mean(rec["lost_steps"] for rec in recoveries)
        row["lost_rank_s"] = _mean(rec["lost_rank_s"] for rec in recoveries)
        rows.append(row)
    return rows


def checkpoint_study(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        "cost": cost_rows(runs),
        "format_size": format_size_rows(runs),
        "scale": scale_rows(runs),
        "determinism": determinism_rows(runs),
        "recovery": recovery_rows(runs),
    }
