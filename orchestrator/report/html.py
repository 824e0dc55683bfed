"""The report as one page: ``faultdrill report WORKDIR --html OUT_DIR`` (and at the end of every
drill, in ``WORKDIR/report/``). ``index.html`` with PNG plots beside it (matplotlib, no network),
each plot followed by a table of the exact values it draws:

- a timeline per run: steps over wall time, one line per attempt, each fault, its detection, the
  next attempt's start and its first step marked, the lost work shaded;
- time to recover, its phases stacked, per framework x strategy x failure class;
- lost work per fault; goodput per run;
- checkpoint size and blocking time against parameter count and ranks, frameworks side by side;
- with more than one checkpoint interval among the faulted runs: measured goodput per interval
  against the Young/Daly model (orchestrator/report/advise.py).

The figures come from the report (orchestrator/report/document.py) and, for the timelines, from each run's
heartbeats (the steps rank 0 reported, with their times).
"""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from experiments.layout import Heartbeat, RunPaths, read_json_lines
from orchestrator.report.advise import daly_interval, predicted_goodput, young_interval
from orchestrator.report.answer import answer_lines
from orchestrator.report.document import build_report, goodput
from orchestrator.report.tables import clock_offsets_line, phase_shown

PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")
MAX_TIMELINES = 40  # a big sweep's page shows the faulted runs' timelines first, up to this many
REPORT_DIR = "report"  # a drill's own page: WORKDIR/report/index.html


@dataclass
class Section:
    title: str
    image: str | None  # PNG file name beside index.html
    tables: list[tuple[list[str], list[list[Any]]]] = field(default_factory=list)  # (header, rows)
    note: str = ""


def write_html_report(workdir: Path, out_dir: Path, report: dict[str, Any] | None = None) -> Path:
    """Write ``out_dir/index.html`` and its PNGs for the drill in ``workdir``; the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    report = report if report is not None else build_report(workdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = report["runs"]
    sections = [
        *_timeline_sections(workdir, runs, out_dir),
        _ttr_section(runs, out_dir),
        _lost_work_section(runs, out_dir),
        _goodput_section(runs, out_dir),
        _checkpoint_section(report, out_dir),
    ]
    interval = _interval_section(runs, out_dir)
    if interval is not None:
        sections.append(interval)
    page = out_dir / "index.html"
    tmp = page.with_name(".index.html.tmp")
    tmp.write_text(_page(report, sections))
    tmp.replace(page)
    return page


# --- the figures -----------------------------------------------------------------------------------


def _figure(out_dir: Path, name: str, draw: Callable[[Any], None], size: tuple[float, float] = (8, 3.6)) -> str:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=size, dpi=100)
    try:
        draw(axes)
        figure.tight_layout()
        figure.savefig(out_dir / name, format="png", bbox_inches="tight")  # legends outside the axes too
    finally:
        plt.close(figure)
    return name


def _no_data(axes: Any, what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} in this drill", ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _timeline_sections(workdir: Path, runs: list[dict[str, Any]], out_dir: Path) -> list[Section]:
    ordered = sorted(runs, key=lambda run: (not run["recoveries"], run["is_baseline"], run["run_id"]))
    return [_timeline(workdir, run, out_dir) for run in ordered[:MAX_TIMELINES]]


def _attempt_curves(workdir: Path, run_id: str) -> dict[int, list[tuple[float, int]]]:
    """(time, step) of each attempt, from rank 0's heartbeats."""
    curves: dict[int, list[tuple[float, int]]] = {}
    paths = RunPaths(workdir / "runs" / run_id)
    for attempt in paths.heartbeat_attempts():
        for record in read_json_lines(paths.heartbeat_file(attempt, 0)):
            try:
                beat = Heartbeat.from_json(record)
            except (KeyError, TypeError, ValueError):
                continue  # not a beat
            if beat.phase is None:  # training beats only
                curves.setdefault(beat.attempt, []).append((beat.time, beat.step))
    return {attempt: sorted(points) for attempt, points in sorted(curves.items())}


def _trained_before(curves: dict[int, list[tuple[float, int]]], recovery: dict[str, Any]) -> list[tuple[float, int]]:
    """The points of the attempt that trained when the fault came (the newest earlier attempt with
    steps before it; restarts that failed before their first step have none)."""
    for attempt in sorted((a for a in curves if a < recovery["attempt"]), reverse=True):
        points = [(t, s) for t, s in curves[attempt] if t <= recovery["fault_at"]]
        if points:
            return points
    return []


def _timeline(workdir: Path, run: dict[str, Any], out_dir: Path) -> Section:
    curves = _attempt_curves(workdir, run["run_id"])
    submitted = [a["submitted"] for a in run["attempts"] if a["submitted"] is not None]
    origin = min(submitted + [t for points in curves.values() for t, _ in points], default=0.0)
    recoveries = run["recoveries"]

    def draw(axes: Any) -> None:
        if not curves:
            _no_data(axes, f"heartbeats of {run['run_id']}")
            return
        for attempt, points in curves.items():
            axes.plot([t - origin for t, _ in points], [s for _, s in points], label=f"attempt {attempt}")
        for index, recovery in enumerate(recoveries):
            fault = recovery["fault_at"] - origin
            marks = [(fault, "fault", "red", "-"), (fault + recovery["detect_s"], "detected", "orange", "--"),
                     (fault + recovery["detect_s"] + recovery["resubmit_s"] + recovery["queue_s"], "restarted",
                      "tab:blue", ":"),
                     (fault + recovery["ttr_s"], "first step", "green", "-.")]
            for x, label, colour, style in marks:
                axes.axvline(x, color=colour, linestyle=style, linewidth=1, label=label if index == 0 else None)
            lost = [(t - origin, s) for t, s in _trained_before(curves, recovery)
                    if s >= recovery["resumed_from_step"]]
            if lost:
                axes.fill_between([t for t, _ in lost], recovery["resumed_from_step"], [s for _, s in lost],
                                  color="red", alpha=0.25, label="lost work" if index == 0 else None)
        axes.set_xlabel("seconds since the first submission")
        axes.set_ylabel("step")
        axes.set_title(f"{run['run_id']}: {run['framework']}, {run['strategy']}, {run['status']}")
        axes.legend(loc="upper left", fontsize="small")

    image = _figure(out_dir, f"timeline-{_safe(run['run_id'])}.png", draw)
    attempts = [[a["job_id"], a["state"], a["failure_class"] or "", _rel(a["submitted"], origin),
                 _rel(a["started"], origin), _rel(a["ended"], origin), a["reason"] or ""] for a in run["attempts"]]
    rows = [[r["fault_kind"], r["failure_class"], _rel(r["fault_at"], origin), phase_shown(r, "detect_s"),
             r["detect_s"] + r["resubmit_s"] + r["queue_s"], r["ttr_s"], r["resumed_from_step"], r["lost_steps"]]
            for r in recoveries]
    return Section(f"Timeline of {run['run_id']}", image, [
        (["job", "state", "class", "submitted s", "started s", "ended s", "reason"], attempts),
        (["fault", "class", "fault at s", "detected after s", "restarted after s", "first step after s (ttr)",
          "resumed from step", "lost steps"], rows),
    ])


def _ttr_section(runs: list[dict[str, Any]], out_dir: Path) -> Section:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for recovery in run["recoveries"]:
            groups.setdefault((run["framework"], recovery["strategy"], recovery["failure_class"] or "-"), []).append(recovery)
    labels = [" / ".join(key) for key in groups]
    means = {key: {phase: statistics.fmean(r[phase] for r in group) for phase in (*PHASES, "ttr_s")}
             for key, group in groups.items()}

    def draw(axes: Any) -> None:
        if not groups:
            _no_data(axes, "recoveries")
            return
        bottom = [0.0] * len(groups)
        for phase in PHASES:
            heights = [means[key][phase] for key in groups]
            axes.barh(labels, heights, left=bottom, label=phase.removesuffix("_s"))
            bottom = [b + h for b, h in zip(bottom, heights, strict=False)]
        axes.set_xlabel("seconds (mean per recovery)")
        axes.set_title("Time to recover, by phase: framework / strategy / failure class")
        axes.legend(fontsize="small", ncols=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, -0.45 if len(groups) < 3 else -0.15))

    image = _figure(out_dir, "ttr-phases.png", draw, size=(8, 2.0 + 0.45 * max(1, len(groups))))
    rows = [[*key, len(groups[key]), *(means[key][phase] for phase in (*PHASES, "ttr_s"))] for key in groups]
    return Section("Time to recover", image,
                   [(["framework", "strategy", "class", "recoveries", *PHASES, "ttr_s"], rows)],
                   clocks_note([recovery for group in groups.values() for recovery in group]))


def clocks_note(recoveries: list[dict[str, Any]]) -> str:
    """What the node clocks allow of the phases above: the offsets applied, and the phases shorter
    than their uncertainty or measured across a clock that was not read."""
    said = [clock_offsets_line([({}, recovery) for recovery in recoveries])]
    below = sum(1 for recovery in recoveries if recovery.get("below_uncertainty"))
    unread = sum(1 for recovery in recoveries if recovery.get("clocks_not_read"))
    if below:
        said.append(f"{below} of {len(recoveries)} recoveries have a phase shorter than the uncertainty of the "
                    "clocks it spans (the text report shows it as a bound)")
    if unread:
        said.append(f"{unread} of {len(recoveries)} recoveries span a node clock that could not be read: "
                    "those phases are not corrected for its offset")
    return "; ".join(part for part in said if part)


def _lost_work_section(runs: list[dict[str, Any]], out_dir: Path) -> Section:
    recoveries = [(run["run_id"], r) for run in runs for r in run["recoveries"]]
    labels = [f"{run_id} #{r['attempt']}" for run_id, r in recoveries]

    def draw(axes: Any) -> None:
        if not recoveries:
            _no_data(axes, "faults with a recovery")
            return
        axes.bar(labels, [r["lost_s"] for _, r in recoveries], color="tab:red")
        axes.set_ylabel("work lost, seconds")
        axes.set_title("Lost work per fault (run #attempt that resumed)")
        axes.tick_params(axis="x", labelrotation=45, labelsize="small")

    image = _figure(out_dir, "lost-work.png", draw)
    rows = [[run_id, r["attempt"], r["fault_kind"], r["resumed_from_step"], r["lost_steps"], r["lost_s"],
             r["lost_rank_s"], r["fallback_lost_steps"]] for run_id, r in recoveries]
    return Section("Lost work", image, [(["run", "attempt", "fault", "resumed from step", "lost steps", "lost s",
                                          "lost rank s", "fallback lost steps"], rows)])


def _goodput_section(runs: list[dict[str, Any]], out_dir: Path) -> Section:
    figures = [(run["run_id"], *goodput(run)) for run in runs]
    shown = [(run_id, value) for run_id, _, _, value in figures if value is not None]

    def draw(axes: Any) -> None:
        if not shown:
            _no_data(axes, "runs with a step time")
            return
        axes.bar([run_id for run_id, _ in shown], [value for _, value in shown], color="tab:green")
        axes.set_ylim(0, 1)
        axes.set_ylabel("useful time / elapsed")
        axes.set_title("Goodput per run")
        axes.tick_params(axis="x", labelrotation=45, labelsize="small")

    image = _figure(out_dir, "goodput.png", draw)
    rows = [[run_id, useful, elapsed, value] for run_id, useful, elapsed, value in figures]
    return Section("Goodput", image, [(["run", "useful s", "elapsed s", "goodput"], rows)],
                   note="useful: the final step x the mean step time; elapsed: first submission to the last "
                        "attempt's end (queueing, start-up, checkpoints, failures and recoveries included)")


def _checkpoint_section(report: dict[str, Any], out_dir: Path) -> Section:
    rows = report["study"]["scale"]
    frameworks = sorted({row["framework"] for row in rows})
    shapes = sorted({(row["params"], row["ranks"]) for row in rows})

    def draw(axes: Any) -> None:
        if not rows:
            _no_data(axes, "checkpoints")
            return
        size_axes, time_axes = axes.figure.subplots(1, 2)
        axes.remove()
        width = 0.8 / len(frameworks)
        for index, framework in enumerate(frameworks):
            mine = {(row["params"], row["ranks"]): row for row in rows if row["framework"] == framework}
            xs = [i + index * width for i, shape in enumerate(shapes) if shape in mine]
            present = [mine[shape] for shape in shapes if shape in mine]
            size_axes.bar(xs, [row["bytes"] / 1e6 for row in present], width, label=framework)
            time_axes.bar(xs, [row["blocking_s"] for row in present], width, label=framework)
        for panel, label in ((size_axes, "checkpoint size, MB"), (time_axes, "blocking time per checkpoint, s")):
            panel.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))],
                             [f"{params:,} params\n{ranks} rank(s)" for params, ranks in shapes], fontsize="small")
            panel.set_ylabel(label)
            panel.legend(fontsize="small")
        size_axes.set_title("Size against parameters and ranks")
        time_axes.set_title("Time against parameters and ranks")

    image = _figure(out_dir, "checkpoints.png", draw, size=(10, 4))
    table = [[row["framework"], row["model"], row["params"], row["ranks"], row["nodes"], row["bytes"],
              row["files_per_checkpoint"], row["blocking_s"], row["persist_s"]] for row in rows]
    return Section("Checkpoints", image, [(["framework", "model", "params", "ranks", "nodes", "bytes", "files",
                                            "blocking s", "persist s"], table)])


def _interval_section(runs: list[dict[str, Any]], out_dir: Path) -> Section | None:
    """Measured goodput per checkpoint interval against Daly's model, if the faulted runs differ in it."""
    measured_goodput = {run["run_id"]: goodput(run)[2] for run in runs}
    faulted = [run for run in runs if not run["is_baseline"] and run["faults"] and run["step_time_s"]
               and run["checkpoint_every_steps"] and measured_goodput[run["run_id"]] is not None]
    intervals = sorted({run["checkpoint_every_steps"] for run in faulted})
    if len(intervals) < 2:
        return None
    step_s = statistics.fmean(run["step_time_s"] for run in faulted)
    cost = statistics.fmean(run["checkpoints"]["mean_blocking_s"] for run in faulted if run["checkpoints"]["count"])
    ttrs = [r["ttr_s"] for run in faulted for r in run["recoveries"]]
    restart = statistics.fmean(ttrs) if ttrs else 0.0
    mtbf, mtbf_source = _mtbf(faulted)
    measured = {every: statistics.fmean(value for run in faulted if run["checkpoint_every_steps"] == every
                                        if (value := measured_goodput[run["run_id"]]) is not None)  # each faulted has one
                for every in intervals}

    best = max(intervals, key=lambda every: measured[every])

    def draw(axes: Any) -> None:
        seconds = [every * step_s for every in intervals]
        axes.plot(seconds, [measured[every] for every in intervals], marker="o", label="measured")
        axes.plot([best * step_s], [measured[best]], marker="*", markersize=14, linestyle="none",
                  color="tab:red", label="measured optimum")
        if mtbf:
            grid = [seconds[0] * (seconds[-1] / seconds[0]) ** (i / 99) for i in range(100)]
            axes.plot(grid, [predicted_goodput(tau, cost, mtbf, restart) for tau in grid], label="Daly's model")
            axes.axvline(young_interval(cost, mtbf), color="grey", linestyle="--", label="Young")
            axes.axvline(daly_interval(cost, mtbf), color="black", linestyle=":", label="Daly")
        axes.set_xscale("log")
        axes.set_xlabel("checkpoint interval, seconds of training")
        axes.set_ylabel("goodput")
        axes.set_title("Checkpoint interval against Young/Daly")
        axes.legend(fontsize="small")

    image = _figure(out_dir, "interval.png", draw)
    def lost_s(every: int) -> float | None:
        lost = [r["lost_s"] for run in faulted if run["checkpoint_every_steps"] == every for r in run["recoveries"]]
        return statistics.fmean(lost) if lost else None

    rows = [_interval_row(every, step_s, measured[every], predicted_goodput(every * step_s, cost, mtbf, restart)
                          if mtbf else None, lost_s(every)) for every in intervals]
    note = (f"checkpoint cost {cost:.3g} s, restart {restart:.3g} s, step {step_s:.3g} s, MTBF "
            + (f"{mtbf:.4g} s ({mtbf_source})" if mtbf else "unknown (no failure)")
            + f"; measured optimum: every {best} steps ({best * step_s:.3g} s)"
            + (f", Young {young_interval(cost, mtbf):.3g} s, Daly {daly_interval(cost, mtbf):.3g} s" if mtbf else ""))
    return Section("Checkpoint interval", image, [(["every steps", "interval s", "measured goodput", "model goodput",
                                                    "mean lost s", "interval / 2 s", "lost / (interval / 2)",
                                                    "within 15 %"], rows)], note)


def _interval_row(every: int, step_s: float, measured: float, model: float | None, lost_s: float | None) -> list[Any]:
    """One interval's figures: the mean lost work per fault against interval/2 (what a fault at a
    uniformly random moment between checkpoints costs), and whether it falls within 15 % of it."""
    half = every * step_s / 2
    ratio = lost_s / half if lost_s is not None and half > 0 else None
    return [every, every * step_s, measured, model, lost_s, half, ratio,
            None if ratio is None else ("yes" if abs(ratio - 1) <= 0.15 else "no")]


def _mtbf(runs: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The mean training time between failures: the drawn delays of the faults that fired (their
    plan: the schedule's own draws), else the elapsed time over the failures."""
    delays = [fault["planned_delay_s"] for run in runs for fault in run["faults"]
              if fault.get("at") is not None and fault.get("planned_delay_s")]
    if delays:
        return statistics.fmean(delays), f"the mean of the {len(delays)} fired faults' drawn delays"
    failures = sum(len(run["recoveries"]) for run in runs)
    elapsed = sum(goodput(run)[1] or 0.0 for run in runs)
    return (elapsed / failures, "elapsed / failures") if failures else (None, "")


# --- the page ----------------------------------------------------------------------------------------


def figure_png(out_dir: Path, name: str, draw: Callable[[Any], None], size: tuple[float, float] = (8, 3.6)) -> str:
    """A PNG beside a page (matplotlib's Agg): its file name."""
    import matplotlib

    matplotlib.use("Agg")
    return _figure(out_dir, name, draw, size)


def write_page(out_dir: Path, title: str, intro: list[str], sections: list[Section]) -> Path:
    """``out_dir/index.html`` of ``sections`` (another command's page: ``faultdrill project``)."""
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{_e(title)}</h1>",
             *(f"<p>{_e(line)}</p>" for line in intro), *_sections_html(sections), "</body></html>\n"]
    page = out_dir / "index.html"
    tmp = page.with_name(".index.html.tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(page)
    return page


def _sections_html(sections: list[Section]) -> list[str]:
    parts = []
    for section in sections:
        parts.append(f"<section><h2>{_e(section.title)}</h2>")
        if section.image:
            parts.append(f"<img src=\"{_e(section.image)}\" alt=\"{_e(section.title)}\">")
        if section.note:
            parts.append(f"<p class=\"note\">{_e(section.note)}</p>")
        parts.extend(_table(header, rows) for header, rows in section.tables)
        parts.append("</section>")
    return parts


def _page(report: dict[str, Any], sections: list[Section]) -> str:
    title = f"Faultdrill report: {report['campaign']} ({report['backend']} backend)"
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{_e(title)}</h1>",
             f"<p>drill {_e(report['drill_id'])}: {len(report['runs'])} run(s)</p>",
             # the answer first, as the terminal gives it (orchestrator/report/answer.py), findings in full
             "<ul class=\"answer\">", *(f"<li>{_e(line)}</li>" for line in answer_lines(report)), "</ul>",
             *(f"<p class=\"note\">{_e(run['run_id'])}: {_e(finding['what'])}</p>"
               for run in report["runs"] for finding in run.get("findings", [])),
             *(f"<p class=\"note\">This site: {_e(note)}</p>" for note in report.get("site_notes") or []),
             _table(["run", "framework", "strategy", "status", "steps", "attempts", "faults", "identical to twin"],
                    [[r["run_id"], r["framework"], r["strategy"], r["status"], f"{r['final_step']}/{r['target_steps']}",
                      len(r["attempts"]), len(r["faults"]),
                      "(twin)" if r["is_baseline"] else r["identical_to_baseline"]] for r in report["runs"]])]
    parts += _sections_html(sections)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    head = "".join(f"<th>{_e(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(_td(cell) for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value: Any) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"<td class=\"num\">{_e(_cell(value))}</td>" if numeric else f"<td>{_e(_cell(value))}</td>"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _rel(moment: float | None, origin: float) -> float | None:
    return None if moment is None else moment - origin


def _e(text: Any) -> str:
    return html.escape(str(text))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
section { margin-bottom: 2.5em; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; font-size: 0.9em; }
"""
