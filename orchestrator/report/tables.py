"""The report for a terminal (rich): the answer first (orchestrator/report/answer.py), then the
tables that matter for the drill, each fitted to the console's width: a table too wide to show its
numbers whole is shown as one record per row instead (never a number cut). ``scope``: "drill" (the
runs, faults and recoveries; the strategies where there are several; the study tables where the
campaign is a study), "study" (the checkpoint study too), "full" (every table)."""

from __future__ import annotations

import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Callable, TypeVar

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from orchestrator.record.outputs import NOT_CHECKED
from orchestrator.report.answer import TERMINAL_ROWS, answer_lines, is_exception, short_cause

SCOPES = ("drill", "study", "full")
# The leading columns that name a row: a record's heading where a table is shown as records.
KEY_HEADERS = frozenset({"run", "#", "kind", "fault", "class", "strategy", "failure class", "framework", "model"})
# Columns that hold counts: a mean of them is shown as a whole number where it is one.
COUNT_COLUMNS = frozenset({"recoveries", "ranks", "nodes", "params", "bytes", "raw param bytes", "lost steps",
                           "resumed from step", "files per checkpoint", "first divergent step", "count"})


Item = TypeVar("Item")


def rows_shown(items: list[Item], exceptional: Callable[[Item], bool]) -> tuple[list[Item], list[Item]]:
    """The rows a terminal shows and those it leaves out: all of them up to TERMINAL_ROWS; past
    it, the exceptional ones (at most TERMINAL_ROWS), the rest counted in a last row (every row is
    in --format json and on the report page)."""
    if len(items) <= TERMINAL_ROWS:
        return items, []
    shown = [item for item in items if exceptional(item)][:TERMINAL_ROWS]
    kept = {id(item) for item in shown}
    return shown, [item for item in items if id(item) not in kept]


def counted(values: list[str]) -> str:
    """``completed 9950, failed 2``: each value and how often, the commonest first."""
    return ", ".join(f"{value} {count}" for value, count in Counter(values).most_common())


class Table(RichTable):
    """A table whose cells are plain text: reasons and details quote errors such as gloo's
    "[/__w/pytorch/.../pair.cc:537]", which rich would read as markup and fail on."""

    def add_row(self, *cells: Any, **options: Any) -> None:
        super().add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells), **options)


def _fmt(value: Any, count: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and count:
        return f"{value:.0f}" if value.is_integer() else f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}" if value and abs(value) < 1e-3 else f"{value:.3f}"
    return str(value)


def report_console() -> Console:
    """A console as wide as the terminal, or as ``COLUMNS`` says; REPORT_WIDTH for a pipe or a file
    that names no width."""
    if os.environ.get("COLUMNS", "").isdigit():
        return Console(width=int(os.environ["COLUMNS"]))
    console = Console()
    return console if console.is_terminal else Console(width=REPORT_WIDTH)


def fit(table: RichTable, console: Console) -> RenderableType:
    """``table`` where it fits the console's width with every cell of a column that may not wrap
    whole; else one record per row: its first column(s) as a heading, then each column's name and
    value, packed into lines of that width."""
    if needed_width(table) <= console.width:
        return table
    lines: list[str] = [str(table.title)] if table.title else []
    keys = next((index for index, column in enumerate(table.columns) if str(column.header) not in KEY_HEADERS),
                len(table.columns)) or 1
    for row in range(table.row_count):
        cells = [(str(column.header), str(column._cells[row])) for column in table.columns]
        lines.append("  ".join(value for _, value in cells[:keys]))
        lines += _packed([f"{name} {value}" for name, value in cells[keys:] if value not in ("", "-")],
                         console.width - 4, indent="    ")
    if table.caption:
        lines.append(str(table.caption))
    return Text("\n".join(lines))


def needed_width(table: RichTable) -> int:
    """The least width that shows every cell whole: a column that may not wrap as wide as its widest
    cell (its header too), one that may as its longest word; each with its padding and border."""
    widths = []
    for column in table.columns:
        cells = [str(column.header), *(str(cell) for cell in column._cells)]
        if column.no_wrap:
            widths.append(max(cell_len(cell) for cell in cells))
        else:
            widths.append(max((cell_len(word) for cell in cells for word in cell.split()), default=1))
    return sum(widths) + 3 * len(widths) + 1


def _packed(pairs: list[str], width: int, indent: str) -> list[str]:
    """``pairs`` joined by three spaces into lines of at most ``width`` (a pair longer than that alone)."""
    lines, line = [], ""
    for pair in pairs:
        if line and len(line) + 3 + len(pair) > width:
            lines.append(indent + line)
            line = pair
        else:
            line = f"{line}   {pair}" if line else pair
    return [*lines, indent + line] if line else lines


def runs_table(report: dict[str, Any]) -> Table:
    """Each run: what it ran, how it ended, and whether it ended as its twin (its checkpoints and
    nodes are in the checkpoint and study tables)."""
    table = Table(title=f"Campaign {report['campaign']} ({report['backend']} backend)",
                  caption=_cost_caption(report.get("controller_cost") or {}))
    for column in ("run", "framework", "ranks", "status", "steps", "attempts", "faults", "as its twin"):
        table.add_column(column, no_wrap=column != "as its twin")
    shown, rest = rows_shown(report["runs"], is_exception)
    for run in shown:
        table.add_row(run["run_id"], run["framework"], str(run["ranks"]), run["status"],
                      f"{run['final_step']}/{run['target_steps']}", str(len(run["attempts"])), str(len(run["faults"])),
                      _identity(run))
    if rest:
        table.add_row(f"... {len(rest)} more", counted([run["framework"] for run in rest]), "",
                      counted([run["status"] for run in rest]), "", str(sum(len(run["attempts"]) for run in rest)),
                      str(sum(len(run["faults"]) for run in rest)), counted([_identity(run) for run in rest]))
    return table


def _identity(run: dict[str, Any]) -> str:
    """The run against its twin: identical or not (by digest, or by the script's outputs and their
    largest difference), or why it was not checked; a replayed resume, or one the script's log says
    was not from its newest checkpoint file, says so beside it."""
    if run["is_baseline"]:
        return "(twin)"
    outputs = run.get("outputs") or {}
    text = {True: "identical", False: "differs"}.get(run["identical_to_baseline"], "-")
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
    behind = (f"; {cost['rounds_behind']} of {cost['rounds']} rounds behind schedule, by {cost['behind_ms_max']:g} ms "
              "at most" if cost.get("rounds_behind") else "")
    return (f"controller: {cost['scheduler_polls']} scheduler polls{issued} ({cost['scheduler_wait_s']:.1f} s waiting "
            f"on the scheduler, {cost['scheduler_poll_failures']} failed), {cost['controller_cpu_s']:.1f} s CPU{behind}")


def recoveries_table(report: dict[str, Any]) -> Table:
    table = Table(title="Recoveries (seconds; ttr = detect + resubmit + queue + startup + load + first step)")
    recoveries = [(run, rec) for run in report["runs"] for rec in run["recoveries"]]
    warm = any(rec.get("state_source") for _, rec in recoveries)  # restart.strategy warm: its own columns
    columns = ("run", "fault", "class", "detect", "resubmit", "queue", "startup", "load", "first step", "ttr",
               "resumed from", "lost steps", "lost s", "lost rank-s", *(("state from", "spare") if warm else ()))
    for column in columns:
        table.add_column(column, no_wrap=True)
    # A long list: the slowest, the rest counted. Grouped by failure class: recoveries from one kind
    # of failure side by side.
    slowest = {id(item) for item in sorted(recoveries, key=lambda item: -item[1]["ttr_s"])[:TERMINAL_ROWS]}
    shown, rest = rows_shown(recoveries, lambda item: id(item) in slowest)
    for run, rec in sorted(shown, key=lambda item: item[1].get("failure_class") or ""):
        inferred = set(run.get("progress", {}).get("inferred", ()))
        table.add_row(run["run_id"], rec["fault_kind"], rec.get("failure_class") or "-", *(
            ("~" if key in inferred else "") + phase_shown(rec, key) for key in (
                "detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s",
                "resumed_from_step", "lost_steps", "lost_s", "lost_rank_s")),
            *((rec.get("state_source") or "-", rec.get("spare") or "-") if warm else ()))
    if rest:
        table.add_row(f"... {len(rest)} more", counted([rec["fault_kind"] for _, rec in rest]),
                      counted([rec.get("failure_class") or "-" for _, rec in rest]), *([""] * 6),
                      f"median {_fmt(statistics.median(rec['ttr_s'] for _, rec in rest))}", "",
                      f"median {_fmt(statistics.median(rec['lost_steps'] for _, rec in rest))}", "", "",
                      *(("", "") if warm else ()))
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
    fired; when it was planned (a delay, or a step) and the step its attempt had reached when it acted;
    what the ranks' own records say of it (checked: verified, INEFFECTIVE, or - where they do not say)."""
    table = Table(title="Faults (details shortened to their cause: the whole text in --format json)")
    for column in ("run", "#", "kind", "target", "attempt", "planned", "met step", "outcome", "checked", "detail"):
        table.add_column(column, no_wrap=column != "detail", overflow="fold")
    faults = [(run, number, fault) for run in report["runs"] for number, fault in enumerate(run["faults"])]
    shown, rest = rows_shown(faults, lambda item: item[2]["outcome"] != "injected" or _checked(item[2]) == "INEFFECTIVE")
    for run, number, fault in shown:
        planned = (f"step {fault['planned_step']}" if fault.get("planned_step") is not None
                   else f"{_fmt(fault['planned_delay_s'])} s")
        met = "" if fault.get("met_step") is None else str(fault["met_step"])
        table.add_row(run["run_id"], str(number), fault["kind"], fault["target"], str(fault["attempt"]),
                      planned, met, fault["outcome"], _checked(fault), short_cause(fault["detail"]))
    if rest:
        table.add_row(f"... {len(rest)} more", "", counted([fault["kind"] for _, _, fault in rest]), "", "", "", "",
                      counted([fault["outcome"] for _, _, fault in rest]),
                      counted([_checked(fault) for _, _, fault in rest]), "")
    return table


def _checked(fault: dict[str, Any]) -> str:
    effect = fault.get("effect") or ""
    return "INEFFECTIVE" if effect.startswith("ineffective") else "verified" if effect else "-"


def checkpoints_table(report: dict[str, Any]) -> Table:
    table = Table(title="Checkpoints")
    for column in ("run", "count", "bytes each", "format", "writers", "mean blocking s", "mean persist s"):
        table.add_column(column, no_wrap=column != "format")
    first = {id(run) for run in report["runs"][:TERMINAL_ROWS]}
    shown, rest = rows_shown(report["runs"], lambda run: id(run) in first)  # a long list: its first rows, the rest counted
    for run in shown:
        ckpt = run["checkpoints"]
        table.add_row(run["run_id"], str(ckpt["count"]), str(ckpt["bytes"]), ckpt["format"], ckpt["writers"],
                      _fmt(ckpt["mean_blocking_s"]), _fmt(ckpt["mean_persist_s"]))
    if rest:
        table.add_row(f"... {len(rest)} more", str(sum(run["checkpoints"]["count"] for run in rest)), "",
                      counted([run["checkpoints"]["format"] for run in rest]), "", "", "")
    return table


STUDY_TITLES = {
    "cost": "Checkpoint study - cost per checkpoint (share = time / one training step)",
    "format_size": "Checkpoint study - format and size (overhead = bytes / raw float32 parameter bytes)",
    "scale": "Checkpoint study - scale",
    "determinism": "Checkpoint study - deterministic resume (faulted run vs its fault-free twin)",
    "recovery": "Checkpoint study - time to recover after a fault (mean seconds per phase)",
}


TEXT_COLUMNS = frozenset({"format", "switches", "compared", "determinism switches"})


def rows_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    columns = list(rows[0]) if rows else ["(no runs)"]
    for column in columns:
        name = column.replace("_", " ").replace("baseline", "twin")
        table.add_column(name, overflow="fold", no_wrap=name not in TEXT_COLUMNS)
    for row in rows:
        table.add_row(*(_fmt(row[column], count=column.replace("_", " ") in COUNT_COLUMNS) for column in columns))
    return table


def strategies_table(report: dict[str, Any]) -> Table:
    return rows_table("Restart strategies x failure classes (mean seconds per phase, mean work lost)",
                      report.get("strategies", []))


def study_tables(report: dict[str, Any]) -> list[Table]:
    study = report.get("study", {})
    return [rows_table(title, study.get(name, [])) for name, title in STUDY_TITLES.items()]


REPORT_WIDTH = 100  # a pipe or a file that names no width (COLUMNS)


def print_report(report: dict[str, Any], console: Console | None = None, page: Path | None = None,
                 scope: str = "drill") -> None:
    """The answer (a line per run that met a fault, the verdict), then the tables ``scope`` asks
    for, each fitted to the console, then the site's notes and the verdict again."""
    console = console or report_console()
    answer = answer_lines(report, page)
    for line in answer:
        console.print(line, markup=False, soft_wrap=True)
    for table in report_tables(report, scope):
        console.print()
        console.print(fit(table, console))
    for note in report.get("site_notes") or []:
        console.print(f"This site: {note}", markup=False)
    for line in findings_lines(report):
        console.print(line, markup=False, soft_wrap=True)
    console.print(answer[-1], markup=False, soft_wrap=True)


def report_tables(report: dict[str, Any], scope: str = "drill") -> list[Table]:
    """The tables that matter for this drill (``scope`` "drill"), with the checkpoint study
    ("study", or a campaign that is a study), or all of them ("full")."""
    runs = report["runs"]
    full, study = scope == "full", scope == "study" or scope == "full" or is_study(report)
    tables = [runs_table(report)]
    if full or any(run["faults"] for run in runs):
        tables.append(faults_table(report))
    if full or any(run["recoveries"] for run in runs):
        tables.append(recoveries_table(report))
    if full or len({run["strategy"] for run in runs}) > 1:
        tables.append(strategies_table(report))
    if study:
        tables += [checkpoints_table(report), *(table for table in study_tables(report) if full or table.row_count)]
    if report.get("slo"):
        tables.append(slo_table(report))
    return tables


def slo_table(report: dict[str, Any]) -> Table:
    """The spec's resilience objectives: each run's bound, what was measured, met or missed."""
    verdict = report["verdict"]
    table = Table(title=f"Resilience objectives (slo): {verdict['slo_met']} met, {verdict['slo_missed']} missed")
    for column in ("objective", "run", "bound", "measured", "met", "why"):
        table.add_column(column, no_wrap=column in ("bound", "measured", "met"))
    shown_results, rest = rows_shown(report["slo"], lambda result: not result["met"])  # a long list: the missed
    for result in shown_results:
        measured = result["measured"]
        shown = "-" if measured is None else str(measured) if isinstance(measured, bool) else f"{measured:.3g}"
        table.add_row(result["objective"], result["run_id"], result["bound"], shown,
                      "yes" if result["met"] else "NO", result["why"])
    if rest:
        table.add_row(counted([result["objective"] for result in rest]), f"... {len(rest)} more", "", "",
                      counted(["yes" if result["met"] else "NO" for result in rest]), "")
    return table


def is_study(report: dict[str, Any]) -> bool:
    """A campaign that compares frameworks, model sizes or scales: its runs differ in one of them."""
    runs = [run for run in report["runs"] if not run["is_baseline"]]
    return len({(run["framework"], run.get("params"), run["ranks"], run["nodes"]) for run in runs}) > 1


def findings_lines(report: dict[str, Any]) -> list[str]:
    """Each run's findings in full (a fault the ranks' records show ineffective, a suspicious
    record), and what the verdict then means; none for a drill without findings."""
    lines = [f"{run['run_id']}: {finding['what']}" for run in report["runs"] for finding in run.get("findings", [])]
    if len(lines) > TERMINAL_ROWS:
        lines[TERMINAL_ROWS:] = [f"... and {len(lines) - TERMINAL_ROWS} more finding(s) (--format json, the report page)"]
    if lines and not report["verdict"]["allowed"]:
        lines.append("The drill is not to be believed as it stands (exit 6); the spec's allow_ineffective: true "
                     "accepts such findings.")
    return lines


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
