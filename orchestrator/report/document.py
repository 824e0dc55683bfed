"""The report: ledger -> one JSON document (the contract) and tables for people."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.layout import EVENT_CHECKPOINT_LOADED, EVENT_WARM_REFUSED, RunPaths, first_event, read_attempt_events
from orchestrator.campaign.strategies import traits_of
from orchestrator.record.effects import INEFFECTIVE, SUSPICIOUS, RunEvidence, verify_run
from orchestrator.record.ledger import Ledger, RunRow
from orchestrator.record.ledger_home import has_ledger
from orchestrator.record.ledger_snapshot import LedgerUnreadable, ledger_snapshot
from orchestrator.record.outputs import IDENTICAL, MISSING, NOT_CHECKED
from orchestrator.report.slo import evaluate as evaluate_slo
from orchestrator.report.study import checkpoint_study

LEDGER_RECOVERY_FIELDS = (
    "attempt", "fault_at", "fault_kind", "detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s",
    "lost_steps", "lost_s", "lost_rank_s", "resumed_from_step", "failure_evidence", "clock_correction_s",
    "failure_class", "class_evidence", "fallback_from_step", "fallback_lost_steps", "failed_restarts",
    "spare", "state_source",
)
# A report's recovery: the ledger's, the run's strategy, and what the clocks allow of its phases:
# each phase's uncertainty (0: one clock; null: a clock not read), the node offsets applied, the
# phases shorter than their uncertainty, and the phases across a clock that was not read.
CLOCK_FIELDS = ("phase_uncertainty_s", "clock_offsets", "below_uncertainty", "clocks_not_read")
RECOVERY_FIELDS = (*LEDGER_RECOVERY_FIELDS, "strategy", *CLOCK_FIELDS)


class ReportError(RuntimeError):
    pass


def build_report(workdir: Path, ledger: Ledger | None = None) -> dict[str, Any]:
    """The drill's report from its workdir (``ledger``: one the caller opened, e.g. a snapshot of
    it; the runs' files are read from the workdir either way)."""
    if ledger is not None:
        return _report(workdir, ledger)
    if not has_ledger(workdir):
        raise ReportError(f"{workdir}: no ledger.sqlite here; is this a campaign workdir?")
    try:
        with ledger_snapshot(workdir) as own:  # the drill's file is read, never written
            return _report(workdir, own)
    except LedgerUnreadable as error:
        raise ReportError(str(error)) from None


def _report(workdir: Path, ledger: Ledger) -> dict[str, Any]:
    runs = ledger.runs()
    digests = {run.run_id: run.final_digest for run in runs}
    run_reports = [_run_report(ledger, run, digests, workdir / "runs") for run in runs]
    spec = ledger.meta("spec") or {}
    slo = [result.to_dict() for result in evaluate_slo(spec.get("slo") or [], run_reports)]
    return {
        "verdict": drill_verdict(run_reports, bool(spec.get("allow_ineffective", False)), slo),
        # the spec's resilience objectives, one result per run and bound (orchestrator/report/slo.py)
        "slo": slo,
        "campaign": ledger.meta("campaign", ""),
        "backend": ledger.meta("backend", ""),
        "drill_id": ledger.meta("drill_id", ""),
        "controller_cost": ledger.meta("controller_cost", {}),
        "site_notes": ledger.meta("site_notes", []),  # what the site did not give the drill
        "runs": run_reports,
        "strategies": strategy_summary(run_reports),
        "study": checkpoint_study(run_reports),
    }


def _run_report(ledger: Ledger, run: RunRow, digests: dict[str, str], runs_dir: Path) -> dict[str, Any]:
    report = _run_facts(ledger, run, digests, runs_dir)
    report["goodput"] = goodput(report)[2]  # useful time / elapsed (None: no step time or end)
    return report


def _run_facts(ledger: Ledger, run: RunRow, digests: dict[str, str], runs_dir: Path) -> dict[str, Any]:
    baseline_digest = _baseline_digest(run, digests)
    identical = None
    if baseline_digest and run.final_digest:
        identical = baseline_digest == run.final_digest
    outputs = json.loads(run.outputs) if run.outputs else None
    if outputs is not None and outputs["verdict"] != MISSING:
        identical = outputs["verdict"] == IDENTICAL
    checkpoints = _checkpoint_summary(ledger, run.run_id, run)
    recovery_rows, fault_rows, attempt_rows = (ledger.recoveries(run.run_id), ledger.faults(run.run_id),
                                               ledger.attempts(run.run_id))
    recoveries = [{**{key: asdict(r)[key] for key in LEDGER_RECOVERY_FIELDS}, "strategy": run.strategy,
                   **clock_view(asdict(r))} for r in recovery_rows]
    paths = RunPaths(runs_dir / run.run_id)
    effects, findings = verify_run(RunEvidence(paths, run.ranks, fault_rows, recovery_rows, attempt_rows))
    return {
        "run_id": run.run_id,
        "framework": run.framework,
        "model": run.model,
        "params": run.params or run.requested_params,
        "step_time_s": run.step_time_s,
        "ranks": run.ranks,
        "nodes": run.nodes,
        "strategy": run.strategy,
        "status": run.status,
        "ended_because": run.ended_because,
        "is_baseline": run.baseline_of is not None,
        "target_steps": run.target_steps,
        "checkpoint_every_steps": json.loads(run.config).get("checkpoint", {}).get("every_steps"),
        "final_step": run.final_step,
        "attempts": [
            # started: the job's first line ran (batch script, or rank 0 on the local backend);
            # None if it never started. accepted: the scheduler took it.
            {"job_id": a.job_id or "", "state": a.state, "submitted": a.submitted, "accepted": a.accepted,
             "started": a.started, "ended": a.ended, "reason": a.reason,
             "failure_class": a.failure_class, "class_evidence": a.class_evidence,
             "failed_nodes": _nodes(a.failed_nodes), "excluded_nodes": _nodes(a.excluded_nodes)}
            for a in attempt_rows
        ],
        "checkpoints": checkpoints,
        "faults": [
            {"kind": f.kind, "target": f.target, "at": f.at, "signal": f.signal, "outcome": f.outcome,
             "detail": f.detail, "attempt": f.attempt, "planned_delay_s": f.planned_delay_s,
             "planned_step": f.planned_step, "met_step": f.met_step,
             # what the ranks' own records say of it (orchestrator/record/effects.py); "" not checked
             "effect": effect}
            for f, effect in zip(fault_rows, effects, strict=True)
        ],
        "recoveries": recoveries,
        # ineffective faults and suspicious records: the drill is not to be believed as it stands
        "findings": [finding.to_dict() for finding in findings],
        # A resumed run is one that restarted from a checkpoint: only those say anything about
        # deterministic resume (a run that never failed is trivially identical to its twin).
        "resumed": any(r["resumed_from_step"] > 0 for r in recoveries),
        "final_digest": run.final_digest,
        "baseline_digest": baseline_digest,
        "identical_to_baseline": identical,
        # The user's script: the files it left against its twin's, or why identity was not checked.
        "outputs": outputs if outputs is not None else _outputs_note(run),
        "max_abs_weight_diff": run.max_abs_weight_diff,
        "first_divergent_step": run.first_divergent_step,
        "determinism_switches": run.determinism,
        "progress": progress_figures(run, paths),
        # warm: connections the job's coordinator turned away (no proof of the job's secret, a slot
        # it never launched or one held): a stranger on the nodes, or a member that went wrong.
        "warm_refused": _warm_refused(paths, [a.attempt for a in attempt_rows]) if traits_of(run.strategy).warm else 0,
    }


def drill_verdict(run_reports: list[dict[str, Any]], allowed: bool, slo: list[dict[str, Any]]) -> dict[str, Any]:
    """The drill's findings counted (orchestrator/record/effects.py), whether the spec allows them
    (``allow_ineffective``: a drill with findings it does not allow is not to be believed), and
    its objectives met and missed."""
    findings = [finding for run in run_reports for finding in run["findings"]]
    counts = {verdict: sum(1 for finding in findings if finding["verdict"] == verdict)
              for verdict in (INEFFECTIVE, SUSPICIOUS)}
    missed = sum(1 for result in slo if not result["met"])
    return {**counts, "allowed": allowed, "believed": not findings or allowed,
            "slo_met": len(slo) - missed, "slo_missed": missed}


def goodput(run: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(useful s, elapsed s, goodput): useful = the steps trained once x the mean step time; elapsed
    = first submission to the last attempt's end."""
    submitted = [a["submitted"] for a in run["attempts"] if a["submitted"] is not None]
    ended = [a["ended"] for a in run["attempts"] if a["ended"] is not None]
    if not submitted or not ended or not run["step_time_s"]:
        return None, None, None
    useful, elapsed = run["final_step"] * run["step_time_s"], max(ended) - min(submitted)
    return useful, elapsed, (useful / elapsed if elapsed > 0 else None)


def clock_view(recovery: dict[str, Any]) -> dict[str, Any]:
    """What the clocks allow of a recovery's phases (CLOCK_FIELDS)."""
    bounds = json.loads(recovery.get("phase_uncertainty") or "{}")
    return {"phase_uncertainty_s": bounds, "clock_offsets": json.loads(recovery.get("clock_offsets") or "{}"),
            "below_uncertainty": [phase for phase, bound in bounds.items() if bound and recovery[phase] <= bound],
            "clocks_not_read": [phase for phase, bound in bounds.items() if bound is None]}


def _warm_refused(paths: RunPaths, attempts: list[int]) -> int:
    """Connections the warm coordinator refused: an event each, or one for many (its count)."""
    return sum(int(event.number("count", 1.0)) for attempt in attempts for event in read_attempt_events(paths, attempt)
               if event.name == EVENT_WARM_REFUSED)


# Zero-code mode: what the drill can only infer from a script's logs or files (the rest is measured).
INFERRED_IN_ZERO_CODE = ("startup_s", "load_s", "first_step_s", "resumed_from_step", "lost_steps", "lost_s",
                         "lost_rank_s", "final_digest")


def progress_figures(run: RunRow, paths: RunPaths | None = None) -> dict[str, Any]:
    """Where the run's progress came from (built-in, the rank API, a script's logs or files) and
    which of its figures are therefore inferred, not measured; a resume the script's log says was
    not from its newest checkpoint file, by attempt."""
    workload = json.loads(run.config or "{}").get("workload", {})
    if not workload.get("command"):
        return {"source": "built-in", "inferred": []}
    progress = workload.get("progress") or {}
    source = "log" if progress.get("log") else "checkpoints" if progress.get("checkpoints") else "api"
    figures: dict[str, Any] = {"source": source, "inferred": [] if source == "api" else list(INFERRED_IN_ZERO_CODE)}
    if source != "api" and run.final_step > run.target_steps:
        # The script's own step count went past the plan: a resume that replayed steps (an epoch
        # restarted at its first batch, Keras 3's BackupAndRestore) trains more than its twin.
        figures["replayed"] = (f"the script's steps went past its last step ({run.final_step} of {run.target_steps}): "
                               "a resume replayed steps it had already run")
    mismatches = _resume_mismatches(paths) if paths is not None and source != "api" else {}
    if mismatches:
        figures["resume_mismatch"] = mismatches
    return figures


def _resume_mismatches(paths: RunPaths) -> dict[str, str]:
    """Attempt -> what its resume's log said against the script's newest checkpoint file."""
    found: dict[str, str] = {}
    for attempt in paths.heartbeat_attempts():
        loaded = first_event(read_attempt_events(paths, attempt), EVENT_CHECKPOINT_LOADED)
        if loaded is not None and loaded.fields.get("resume_mismatch"):
            found[str(attempt)] = str(loaded.fields["resume_mismatch"])
    return found


STRATEGY_PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s",
                   "lost_steps", "lost_s")


def strategy_summary(run_reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per restart strategy x failure class: how many recoveries, the mean of each phase
    and of the work lost (the strategies compared on the same faults)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in run_reports:
        for recovery in run["recoveries"]:
            groups.setdefault((recovery["strategy"], recovery["failure_class"] or "-"), []).append(recovery)
    return [{"strategy": strategy, "failure_class": failure_class, "recoveries": len(recoveries),
             **{key: sum(r[key] for r in recoveries) / len(recoveries) for key in STRATEGY_PHASES}}
            for (strategy, failure_class), recoveries in sorted(groups.items())]


def _nodes(joined: str | None) -> list[str]:
    return joined.split(",") if joined else []


def _baseline_digest(run: RunRow, digests: dict[str, str]) -> str | None:
    if run.baseline_of is not None:
        return None
    twin = digests.get(run.twin or f"{run.run_id}-baseline")  # ledgers older than shared twins
    return twin or None


def _checkpoint_summary(ledger: Ledger, run_id: str, run: RunRow) -> dict[str, Any]:
    """Per-checkpoint cost and size; shares are of one training step, overhead is over the raw
    float32 parameter bytes (weights alone: optimizer state and RNG are what it adds)."""
    records = ledger.checkpoints(run_id)
    raw_bytes = 4 * (run.params or run.requested_params)
    summary: dict[str, Any] = {
        "count": len(records), "bytes": 0, "format": "", "writers": "", "files_per_checkpoint": 0,
        "mean_blocking_s": 0.0, "mean_persist_s": 0.0, "raw_param_bytes": raw_bytes,
        "overhead_vs_raw": None, "blocking_share_of_step": None, "persist_share_of_step": None,
    }
    if not records:
        return summary
    blocking = statistics.fmean(r.blocking_s for r in records)
    persist = statistics.fmean(r.persist_s for r in records)
    summary.update(
        bytes=records[-1].bytes, format=records[-1].format, writers=records[-1].writers,
        files_per_checkpoint=len(records[-1].files), mean_blocking_s=blocking, mean_persist_s=persist,
        overhead_vs_raw=records[-1].bytes / raw_bytes if raw_bytes else None,
    )
    if run.step_time_s:
        summary.update(blocking_share_of_step=blocking / run.step_time_s, persist_share_of_step=persist / run.step_time_s)
    return summary


def _outputs_note(run: RunRow) -> dict[str, Any] | None:
    """A run of the user's own script with a twin and no ``workload.outputs``: identity not checked
    (never nothing: a drill whose resume changed training must not read as fine)."""
    workload = json.loads(run.config).get("workload", {})
    if workload.get("command") is None or not run.twin:
        return None
    if workload.get("outputs"):
        return {"verdict": None, "note": "outputs not compared: the run or its twin did not complete"}
    return {"verdict": None, "note": NOT_CHECKED}
