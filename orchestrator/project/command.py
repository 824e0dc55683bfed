"""``faultdrill project WORKDIR``: its arguments, and its answer as tables or one JSON document."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.project.assumptions import Assumptions
from orchestrator.project.failure_models import FailureModelError, load_failure_model, shipped_models
from orchestrator.report.tables import Table, report_console

if TYPE_CHECKING:  # NumPy and the simulator load when a projection is made, not with the CLI
    from orchestrator.project.projection import Grid, Projection



class ProjectError(ValueError):
    """A projection that cannot be made: what is wrong, and what would do."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "project", help="what failures would cost the job at 1,000-100,000 GPUs, from a drill's measurements",
        description="A Monte Carlo simulation of the long job at each scale, per restart strategy, spare nodes and "
                    "checkpoint interval, from the drill's measured recoveries and checkpoint cost (WORKDIR) and a "
                    "failure model; what a small cluster cannot measure is a named assumption, printed with it.")
    parser.add_argument("workdir", type=Path, help="a drill's workdir (or its spec)")
    parser.add_argument("--gpus", type=_ints, default=(1024, 4096, 16384), help="scales, e.g. 1024,4096,16384")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of a node (each scale a whole number of nodes)")
    parser.add_argument("--days", type=float, default=30.0, help="the job's training time without failures")
    parser.add_argument("--failure-model", default="meta-rsc",
                        help=f"a shipped model ({', '.join(shipped_models())}) or a YAML file of the same form")
    parser.add_argument("--strategies", type=_words, help="of those the drill measured (default: all of them)")
    parser.add_argument("--spares", type=_ints, default=(0, 1, 4, 16), help="spare nodes (in-allocation, warm)")
    parser.add_argument("--interval", default="auto",
                        help="checkpoint intervals in seconds (S,S,...) or auto: 0.5-2 x Daly's optimum at each scale")
    parser.add_argument("--state-gb", type=float, help="the job's checkpoint size (default: the drill's largest)")
    parser.add_argument("--replicas", type=int, default=200, help="simulated jobs per cell")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's random seed (the same seed, the same answer)")
    parser.add_argument("--queue-wait-s", type=float, default=Assumptions.queue_wait_s,
                        help="assumed: a new job's wait for its nodes at scale, seconds")
    parser.add_argument("--startup-per-doubling-s", type=float, default=Assumptions.startup_per_doubling_s,
                        help="assumed: the start-up's growth per doubling of the drill's GPUs, seconds")
    parser.add_argument("--repair-h", type=float, default=Assumptions.repair_h,
                        help="assumed: a dead node's time out of the pool, hours")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="tables or one JSON document")
    parser.add_argument("--html", type=Path, metavar="DIR", help="also write the page (three plots, their tables) here")
    parser.add_argument("--replay", action="store_true",
                        help="instead: replay each faulted run of the drill with its own failures and recoveries, "
                             "its predicted goodput beside the measured one (the model checked against the drill)")


def run(args: argparse.Namespace) -> "Projection":
    from orchestrator.project.measured import MissingMeasurements, read_measured
    from orchestrator.project.projection import Grid, project

    try:
        model = load_failure_model(args.failure_model)
        measured = read_measured(args.workdir)
    except (FailureModelError, MissingMeasurements) as error:
        raise ProjectError(str(error)) from None
    grid = Grid(gpus=tuple(args.gpus), gpus_per_node=args.gpus_per_node, days=args.days,
                strategies=tuple(args.strategies) if args.strategies else None, spares=tuple(args.spares),
                intervals_s=_intervals(args.interval), replicas=args.replicas, seed=args.seed,
                state_bytes=args.state_gb * 1e9 if args.state_gb is not None else None)
    _check(grid)
    try:
        return project(measured, model, grid, Assumptions(args.queue_wait_s, args.startup_per_doubling_s, args.repair_h))
    except ValueError as error:
        raise ProjectError(str(error)) from None


def print_projection(projection: "Projection", output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(projection.to_dict(), indent=2))
        return
    console = report_console()
    for table in projection_tables(projection):
        console.print(table)
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
    cells = Table(title="Every cell: goodput (95 % CI), failures, hours lost per cause (means of the replicas)")
    for column in ("GPUs", "strategy", "spares", "interval", "goodput", "failures", "new jobs", "restart h",
                   "rework h", "checkpoint h"):
        cells.add_column(column)
    for row in projection.rows:
        restart = sum(value for name, value in row.lost_h.items() if name.endswith("_s"))
        cells.add_row(str(row.gpus), row.strategy, str(row.spares), f"{row.interval_s:.0f} s",
                      f"{row.goodput:.3f} ± {row.goodput_ci95:.3f}", f"{row.failures:.0f}", f"{row.new_jobs:.0f}",
                      f"{restart:.1f}", f"{row.lost_h['rework']:.1f}", f"{row.lost_h['checkpoints']:.1f}")
    said = Table(title="Assumed, not measured (pass your site's own)")
    for column in ("name", "value", "source"):
        said.add_column(column)
    for item in projection.assumptions:
        said.add_row(item["name"], f"{item['value']:g}", item["source"])
    return [best, cells, said]


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
    if grid.intervals_s is not None and min(grid.intervals_s) <= 0:
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
    """``--replay``: every faulted run's measured and replayed goodput; exit 1 if none was replayed."""
    from dataclasses import asdict

    from orchestrator.project.replay import replay_drill

    replays = replay_drill(workdir)
    if output_format == "json":
        print(json.dumps([{**asdict(run), "error": run.error} for run in replays], indent=2))
    else:
        table = Table(title="Each faulted run replayed through the model: goodput predicted against measured")
        for column in ("run", "strategy", "failures", "measured", "replayed", "error", "lost s (drill)", "lost s (model)"):
            table.add_column(column)
        for run in replays:
            table.add_row(run.run_id, run.strategy, str(run.failures), f"{run.measured_goodput:.4f}",
                          f"{run.replayed_goodput:.4f}", f"{100 * run.error:+.2f} %", f"{run.measured_lost_s:.2f}",
                          f"{run.replayed_lost_s:.2f}")
        report_console().print(table)
    if not replays:
        raise ProjectError(f"{workdir}: no run failed, recovered and completed: nothing to replay")
    return 0
