"""The report as tables for a terminal (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table as RichTable
from rich.text import Text

from orchestrator.record.outputs import NOT_CHECKED


class Table(RichTable):
    """A table whose cells are plain text: reasons and details quote errors such as gloo's
    "[/__w/pytorch/.../pair.cc:537]", which rich would read as markup and fail on."""

    def add_row(self, *cells: Any, **options: Any) -> None:
        super().add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells), **options)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if value and abs(value) < 1e-3 else f"{value:.3f}"
    return str(value)


def runs_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"Campaign {report['campaign']} ({report['backend']} backend)",
                  caption=_cost_caption(report.get("controller_cost") or {}))
    for column in ("run", "framework", "ranks", "nodes", "status", "steps", "attempts", "faults",
                   "checkpoints", "identical to baseline"):
        table.add_column(column)
    for run in report["runs"]:
        ckpt = run["checkpoints"]
        table.add_row(
            run["run_id"], run["framework"], str(run["ranks"]), str(run["nodes"]), run["status"],
            f"{run['final_step']}/{run['target_steps']}", str(len(run["attempts"])), str(len(run["faults"])),
            f"{ckpt['count']} x {ckpt['bytes'] / 1e6:.1f} MB",
            _identity(run),
        )
    return table


def _identity(run: dict[str, Any]) -> str:
    """The run against its twin: identical or not (by digest, or by the script's outputs and their
    largest difference), or why it was not checked; a replayed resume, or one the script's log says
    was not from its newest checkpoint file, says so beside it."""
    if run["is_baseline"]:
        return "(baseline)"
    outputs = run.get("outputs") or {}
    text = _fmt(run["identical_to_baseline"])
    if outputs.get("verdict") in ("differs", "missing"):
        text = f"{outputs['verdict']}" + (f" (max {outputs['max_abs_diff']:.3g})" if outputs.get("max_abs_diff") else "")
    elif outputs.get("note") == NOT_CHECKED:
        text = "not checked (workload.outputs)"
    progress = run.get("progress") or {}
    if progress.get("replayed"):
        text += "; replayed steps"
    if progress.get("resume_mismatch"):
        text += "; resumed from an older step than its newest checkpoint file"
    return text


def _cost_caption(cost: dict[str, Any]) -> str | None:
    if not cost:
        return None
    commands = cost.get("scheduler_poll_commands")
    issued = f", {commands} commands" if commands is not None else ""
    return (f"controller: {cost['scheduler_polls']} scheduler polls{issued} ({cost['scheduler_wait_s']:.1f} s waiting "
            f"on the scheduler, {cost['scheduler_poll_failures']} failed), {cost['controller_cpu_s']:.1f} s CPU")


def recoveries_table(report: dict[str, Any]) -> Table:
    table = Table(title="Recoveries (seconds; ttr = detect + resubmit + queue + startup + load + first step)")
    recoveries = [(run, rec) for run in report["runs"] for rec in run["recoveries"]]
    warm = any(rec.get("state_source") for _, rec in recoveries)  # restart.strategy warm: its own columns
    columns = ("run", "fault", "class", "detect", "resubmit", "queue", "startup", "load", "first step", "ttr",
               "resumed from", "lost steps", "lost s", "lost rank-s", *(("state from", "spare") if warm else ()))
    for column in columns:
        table.add_column(column)
    # Grouped by failure class: recoveries from one kind of failure side by side.
    for run, rec in sorted(recoveries, key=lambda item: item[1].get("failure_class") or ""):
        inferred = set(run.get("progress", {}).get("inferred", ()))
        table.add_row(run["run_id"], rec["fault_kind"], rec.get("failure_class") or "-", *(
            ("~" if key in inferred else "") + phase_shown(rec, key) for key in (
                "detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s",
                "resumed_from_step", "lost_steps", "lost_s", "lost_rank_s")),
            *((rec.get("state_source") or "-", rec.get("spare") or "-") if warm else ()))
    captions = []
    if any(run.get("progress", {}).get("inferred") for run in report["runs"]):
        captions.append("~ inferred, not measured: a zero-code script's start-up ends at its first step logged, "
                        "and the step it resumed from is read from its logs or files")
    if any(rec.get("below_uncertainty") for _, rec in recoveries):
        captions.append("<= x: shorter than the uncertainty of the node clocks it is measured across; at most x")
    if any(rec.get("clocks_not_read") for _, rec in recoveries):
        captions.append("? across a node clock that could not be read: not corrected for its offset")
    offsets = clock_offsets_line(recoveries)
    if offsets:
        captions.append(offsets)
    table.caption = "\n".join(captions) or None
    return table


def phase_shown(recovery: dict[str, Any], key: str) -> str:
    """A phase as the clocks allow: its bound where it is shorter than its uncertainty, marked where
    a clock was not read."""
    bound = (recovery.get("phase_uncertainty_s") or {}).get(key)
    if key in recovery.get("below_uncertainty", ()):
        return f"<={_fmt(recovery[key] + bound)}"
    return _fmt(recovery[key]) + ("?" if key in recovery.get("clocks_not_read", ()) else "")


def clock_offsets_line(recoveries: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The node clocks the phases were corrected by (of a node read more than once, the last listed)."""
    newest: dict[str, list[float]] = {}
    for _, recovery in recoveries:
        newest.update(recovery.get("clock_offsets") or {})
    said = ", ".join(f"{node} {offset:+.4f} +-{bound:.4f}" for node, (offset, bound) in sorted(newest.items()))
    return f"node clocks against the login node's (s): {said}" if said else ""


def faults_table(report: dict[str, Any]) -> Table:
    """Every planned fault and how it ended: injected (what it caused), refused, absorbed, late, not
    fired; when it was planned (a delay, or a step) and the step its attempt had reached when it acted."""
    table = Table(title="Faults")
    for column in ("run", "#", "kind", "target", "attempt", "planned", "met step", "outcome", "detail"):
        table.add_column(column, overflow="fold")
    for run in report["runs"]:
        for number, fault in enumerate(run["faults"]):
            planned = (f"step {fault['planned_step']}" if fault.get("planned_step") is not None
                       else f"{_fmt(fault['planned_delay_s'])} s")
            met = "" if fault.get("met_step") is None else str(fault["met_step"])
            table.add_row(run["run_id"], str(number), fault["kind"], fault["target"], str(fault["attempt"]),
                          planned, met, fault["outcome"], fault["detail"] or "")
    return table


def checkpoints_table(report: dict[str, Any]) -> Table:
    table = Table(title="Checkpoints")
    for column in ("run", "count", "bytes each", "format", "writers", "mean blocking s", "mean persist s"):
        table.add_column(column)
    for run in report["runs"]:
        ckpt = run["checkpoints"]
        table.add_row(run["run_id"], str(ckpt["count"]), str(ckpt["bytes"]), ckpt["format"], ckpt["writers"],
                      _fmt(ckpt["mean_blocking_s"]), _fmt(ckpt["mean_persist_s"]))
    return table


STUDY_TITLES = {
    "cost": "Checkpoint study - cost per checkpoint (share = time / one training step)",
    "format_size": "Checkpoint study - format and size (overhead = bytes / raw float32 parameter bytes)",
    "scale": "Checkpoint study - scale",
    "determinism": "Checkpoint study - deterministic resume (faulted run vs fault-free twin)",
    "recovery": "Checkpoint study - time to recover after a fault (mean seconds per phase)",
}


def rows_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    columns = list(rows[0]) if rows else ["(no runs)"]
    for column in columns:
        table.add_column(column.replace("_", " "), overflow="fold")
    for row in rows:
        table.add_row(*(_fmt(row[column]) for column in columns))
    return table


def strategies_table(report: dict[str, Any]) -> Table:
    return rows_table("Restart strategies x failure classes (mean seconds per phase, mean work lost)",
                      report.get("strategies", []))


def study_tables(report: dict[str, Any]) -> list[Table]:
    study = report.get("study", {})
    return [rows_table(title, study.get(name, [])) for name, title in STUDY_TITLES.items()]


REPORT_WIDTH = 160  # when printing to a file or pipe, where rich would otherwise assume 80 columns


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=REPORT_WIDTH)
    console.print(Group(runs_table(report), faults_table(report), recoveries_table(report), strategies_table(report),
                        checkpoints_table(report)))
    console.print(Group(*study_tables(report)))
    for note in report.get("site_notes") or []:
        console.print(f"This site: {note}", markup=False)


def advice_table(document: dict[str, Any]) -> Table:
    """``faultdrill advise``: each rule's interval, in seconds and steps, and what it predicts."""
    given = document["inputs"]
    table = Table(title="Checkpoint interval advice (failures a Poisson process)",
                  caption=(f"checkpoint cost {given['checkpoint_s']:.3g} s, MTBF {given['mtbf_s']:.6g} s, "
                           f"restart {given['restart_s']:.3g} s, step {_fmt(given['step_s'])} s ({given['source']})"))
    for column in ("rule", "interval s", "interval steps", "predicted goodput", "lost per failure s"):
        table.add_column(column)
    for interval in document["intervals"]:
        table.add_row(interval["rule"], f"{interval['seconds']:.4g}", _fmt(interval["steps"]),
                      f"{interval['goodput']:.4f}", f"{interval['lost_per_failure_s']:.4g}")
    return table


def doctor_table(document: dict[str, Any]) -> Table:
    """``faultdrill doctor``: each finding, worst first within its order, with what to do."""
    summary = document["summary"]
    table = Table(title=f"faultdrill doctor: {document['backend']} backend, workdir {document['workdir']}",
                  caption=f"{summary['pass']} pass, {summary['warn']} warn, {summary['fail']} fail")
    for column in ("", "check", "found", "what to do"):
        table.add_column(column, overflow="fold")
    for check in document["checks"]:
        table.add_row(check["status"].upper(), check["name"], check["detail"], check["fix"])
    return table
