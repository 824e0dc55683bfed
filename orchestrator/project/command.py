"""``faultdrill project WORKDIR``: its arguments, and its answer as tables or one JSON document."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.project.assumptions import Assumptions
from orchestrator.project.failure_models import FailureModelError, load_failure_model, shipped_models
from orchestrator.report.tables import Table, fit, report_console

if TYPE_CHECKING:  # NumPy and the simulator load when a projection is made, not with the CLI
    from orchestrator.project.projection import Grid, Projection



class ProjectError(ValueError):
    """A projection that cannot be made: what is wrong, and what would do."""


PAGE_TITLE = "Faultdrill projection: what failures cost at scale"  # --html: its page, and how one is known
# Options of a projection (``--replay`` takes none of them): their defaults, applied in ``run``.
DEFAULTS: dict[str, Any] = {
    "gpus": (1024, 4096, 16384), "gpus_per_node": 8, "days": 30.0, "failure_model": "meta-rsc", "strategies": None,
    "spares": (0, 1, 4, 16), "interval": "auto", "state_gb": None, "checkpoint_s": None, "replicas": 200, "seed": 0,
    "queue_wait_s": Assumptions.queue_wait_s, "startup_per_doubling_s": Assumptions.startup_per_doubling_s,
    "repair_h": Assumptions.repair_h, "html": None,
}
MAX_DAYS = 3650.0  # ten years of training: past it, a typo


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "project", help="what failures would cost the job at 1,000-100,000 GPUs, from a drill's measurements",
        description="A Monte Carlo simulation of the long job at each scale, per restart strategy, spare nodes and "
                    "checkpoint interval, from the drill's measured recoveries and checkpoint cost (WORKDIR) and a "
                    "failure model; what a small cluster cannot measure is a named assumption, printed with it.")
    parser.add_argument("workdir", type=Path, help="a drill's workdir (or its spec)")
    parser.add_argument("--gpus", type=_ints, help="scales, e.g. 1024,4096,16384 (the default)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs of a node (each scale a whole number of nodes; 8)")
    parser.add_argument("--days", type=float, help="the job's training time without failures (30)")
    parser.add_argument("--failure-model",
                        help=f"a shipped model ({', '.join(shipped_models())}; meta-rsc) or a YAML file of the same form")
    parser.add_argument("--strategies", type=_words, help="of those the drill measured (default: all of them)")
    parser.add_argument("--spares", type=_ints, help="spare nodes (in-allocation, warm; 0,1,4,16)")
    parser.add_argument("--interval",
                        help="checkpoint intervals in seconds (S,S,...) or auto (the default: 0.5-2 x Daly's optimum "
                             "at each scale, or x the first interval that does not wait for an asynchronous write "
                             "where that is longer)")
    parser.add_argument("--state-gb", type=float, help="the job's checkpoint size (default: the drill's largest)")
    parser.add_argument("--checkpoint-s", type=float,
                        help="a checkpoint's blocking time at --state-gb, your own figure (a script whose checkpoints "
                             "the drill did not time), in place of the drill's")
    parser.add_argument("--replicas", type=int, help="simulated jobs per cell (200)")
    parser.add_argument("--seed", type=int, help="the simulation's random seed (the same seed, the same answer; 0)")
    parser.add_argument("--queue-wait-s", type=float,
                        help=f"assumed: a new job's wait for its nodes at scale, seconds ({Assumptions.queue_wait_s:g})")
    parser.add_argument("--startup-per-doubling-s", type=float,
                        help="assumed: the start-up's growth per doubling of the drill's GPUs, seconds "
                             f"({Assumptions.startup_per_doubling_s:g})")
    parser.add_argument("--repair-h", type=float,
                        help=f"assumed: a dead node's time out of the pool, hours ({Assumptions.repair_h:g})")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="tables or one JSON document")
    parser.add_argument("--html", type=Path, metavar="DIR", help="also write the page (three plots, their tables) here")
    parser.add_argument("--replay", action="store_true",
                        help="instead: replay each faulted run of the drill with its own failures and recoveries, "
                             "its predicted goodput beside the measured one (the model checked against the drill)")


def replay_conflicts(args: argparse.Namespace) -> None:
    """``--replay`` projects nothing: a projection's option beside it is refused, not ignored."""
    given = [f"--{name.replace('_', '-')}" for name in DEFAULTS if getattr(args, name) is not None]
    if given:
        raise ProjectError(f"--replay replays the drill's runs at their own scale: {', '.join(given)} "
                           "belong to a projection (leave out --replay, or them)")


def run(args: argparse.Namespace) -> "Projection":
    from orchestrator.project.measured import MissingMeasurements, read_measured
    from orchestrator.project.projection import Grid, project

    chosen = {name: getattr(args, name) if getattr(args, name) is not None else default
              for name, default in DEFAULTS.items()}
    _check_numbers(chosen)
    if chosen["html"] is not None:
        check_page_dir(chosen["html"])
    grid = Grid(gpus=tuple(chosen["gpus"]), gpus_per_node=chosen["gpus_per_node"], days=chosen["days"],
                strategies=tuple(chosen["strategies"]) if chosen["strategies"] else None, spares=tuple(chosen["spares"]),
                intervals_s=_intervals(chosen["interval"]), replicas=chosen["replicas"], seed=chosen["seed"],
                state_bytes=chosen["state_gb"] * 1e9 if chosen["state_gb"] is not None else None)
    _check(grid)
    try:
        model = load_failure_model(chosen["failure_model"])
        measured = read_measured(args.workdir, chosen["checkpoint_s"])
    except (FailureModelError, MissingMeasurements) as error:
        raise ProjectError(str(error)) from None
    assumptions = Assumptions(chosen["queue_wait_s"], chosen["startup_per_doubling_s"], chosen["repair_h"])
    try:
        return project(measured, model, grid, assumptions)
    except ValueError as error:
        raise ProjectError(str(error)) from None


def _check_numbers(chosen: dict[str, Any]) -> None:
    """Every number finite and in its range, named where it is not."""
    bounds = {"days": (0.0, MAX_DAYS, False), "state_gb": (0.0, math.inf, False), "checkpoint_s": (0.0, math.inf, True),
              "queue_wait_s": (0.0, math.inf, True), "startup_per_doubling_s": (0.0, math.inf, True),
              "repair_h": (0.0, math.inf, False)}
    problems = []
    for name, (low, high, low_ok) in bounds.items():
        value = chosen[name]
        if value is None:
            continue
        above = value >= low if low_ok else value > low
        if not (math.isfinite(value) and above and value <= high):
            problems.append(f"--{name.replace('_', '-')} {value:g}: a number {'>=' if low_ok else '>'} {low:g}"
                            + (f" and <= {high:g}" if math.isfinite(high) else ""))
    if chosen["seed"] < 0:
        problems.append(f"--seed {chosen['seed']}: a whole number >= 0")
    if problems:
        raise ProjectError("; ".join(problems))


def check_page_dir(out_dir: Path) -> None:
    """``--html DIR``, before anything is simulated: a directory (made if missing) whose index.html,
    if any, is an earlier projection's page (never a drill's report, nor a file in DIR's place)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ProjectError(f"--html {out_dir}: a file is there; give a directory for the page")
    index = out_dir / "index.html"
    if index.exists() and PAGE_TITLE not in index.read_text(errors="replace")[:4000]:
        raise ProjectError(f"--html {out_dir}: its index.html is another page (a drill's report?); give a directory "
                           "of its own")


def print_projection(projection: "Projection", output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(projection.to_dict(), indent=2))
        return
    console = report_console()
    for table in projection_tables(projection):
        console.print(fit(table, console))  # a record per row where the terminal is too narrow for the columns
    for note in projection.notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def projection_tables(projection: "Projection") -> list[Table]:
    model = projection.failure_model
    best = Table(title=f"Best per scale and strategy (failure model {model['name']}: {model['source']})")
    for column in ("GPUs", "MTTF", "strategy", "goodput", "interval", "Young", "Daly", "spares"):
        best.add_column(column)
    for top in projection.best:
        best.add_row(str(top["gpus"]), f"{top['mttf_h']:.2f} h", top["strategy"], f"{top['goodput']:.3f}",
                     f"{top['interval_s']:.0f} s", f"{top['young_interval_s']:.0f} s", f"{top['daly_interval_s']:.0f} s",
                     str(top["spares"]))
    cells = Table(title="Every cell: goodput (95 % CI), failures, hours lost per cause (means of the replicas; "
                        "restart: resubmission, start-up, load and first step; each phase in --format json)")
    for column in ("GPUs", "strategy", "spares", "interval", "goodput", "failures", "new jobs", "detect h",
                   "queue h", "restart h", "rework h", "checkpoint h"):
        cells.add_column(column)
    for row in projection.rows:
        restart = sum(value for name, value in row.lost_h.items() if name.endswith("_s")
                      and name not in ("detect_s", "queue_s"))
        cells.add_row(str(row.gpus), row.strategy, str(row.spares), f"{row.interval_s:.0f} s",
                      f"{row.goodput:.3f} ± {row.goodput_ci95:.3f}", f"{row.failures:.0f}", f"{row.new_jobs:.0f}",
                      f"{row.lost_h['detect_s']:.1f}", f"{row.lost_h['queue_s']:.1f}", f"{restart:.1f}",
                      f"{row.lost_h['rework']:.1f}", f"{row.lost_h['checkpoints']:.1f}")
    said = Table(title="Assumed, not measured (pass your site's own)")
    for column in ("name", "value", "source"):
        said.add_column(column)
    for item in projection.assumptions:
        said.add_row(item["name"], f"{item['value']:g}", item["source"])
    return [best, cells, said, causes_table(model)]


def causes_table(model: dict[str, Any]) -> Table:
    """The failure model's mix: what share of failures takes a node (a spare, a new job) and what
    class each cause is drilled as; a share the model's file only assumes says so in its name."""
    causes = Table(title=f"Failure model {model['name']}: its causes ({100 * model['node_share']:.0f} % take their "
                         "node out of the job; a name that says 'assumed' is the file's assumption, not its source's)")
    for column in ("cause", "share", "takes its node", "drilled as"):
        causes.add_column(column)
    for cause in model["causes"]:
        causes.add_row(cause["name"], f"{100 * cause['share']:.0f} %", "yes" if cause["takes_node"] else "no",
                       cause["failure_class"])
    return causes


def _check(grid: "Grid") -> None:
    problems = []
    if not grid.gpus or min(grid.gpus) < 1:
        problems.append("--gpus: one or more scales of at least 1 GPU")
    if grid.gpus_per_node < 1 or grid.days <= 0 or grid.replicas < 2:
        problems.append("--gpus-per-node >= 1, --days > 0 and --replicas >= 2")
    elif any(gpus % grid.gpus_per_node for gpus in grid.gpus):
        problems.append(f"--gpus: each scale a whole number of nodes of --gpus-per-node {grid.gpus_per_node}")
    if any(spares < 0 for spares in grid.spares):
        problems.append("--spares: counts >= 0")
    from orchestrator.project.projection import STRATEGIES

    if grid.strategies and set(grid.strategies) - set(STRATEGIES):
        problems.append(f"--strategies: of {', '.join(STRATEGIES)}")
    if grid.intervals_s is not None and not all(0 < interval < math.inf for interval in grid.intervals_s):
        problems.append("--interval: seconds > 0, or auto")
    if problems:
        raise ProjectError("; ".join(problems))


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers, comma-separated") from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _intervals(text: str) -> tuple[float, ...] | None:
    if text == "auto":
        return None
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ProjectError(f"--interval {text!r}: seconds, comma-separated, or auto") from None


def print_replays(workdir: Path, output_format: str) -> int:
    """``--replay``: every faulted run's measured and replayed goodput, and the runs that could not be
    replayed with the reason; refused (exit 1) if none was replayed."""
    from dataclasses import asdict

    from orchestrator.project.replay import replay_drill
    from orchestrator.report.document import ReportError

    try:
        replays, skipped = replay_drill(workdir)
    except ReportError as error:
        raise ProjectError(str(error)) from None
    if not replays:
        said = "; ".join(f"{run.run_id}: {run.why}" for run in skipped) or "no run had a fault"
        raise ProjectError(f"{workdir}: no run could be replayed ({said})")
    if output_format == "json":
        print(json.dumps({"replayed": [{**asdict(run), "error": run.error} for run in replays],
                          "not_replayed": [asdict(run) for run in skipped]}, indent=2))
        return 0
    table = Table(title="Each faulted run replayed through the model: goodput predicted against measured")
    for column in ("run", "strategy", "failures", "measured", "replayed", "error", "lost s (drill)", "lost s (model)"):
        table.add_column(column)
    for run in replays:
        table.add_row(run.run_id, run.strategy, str(run.failures), f"{run.measured_goodput:.4f}",
                      f"{run.replayed_goodput:.4f}", f"{100 * run.error:+.2f} %", f"{run.measured_lost_s:.2f}",
                      f"{run.replayed_lost_s:.2f}")
    console = report_console()
    console.print(table)
    for left in skipped:
        console.print(f"not replayed: {left.run_id}: {left.why}", highlight=False, markup=False)
    return 0
