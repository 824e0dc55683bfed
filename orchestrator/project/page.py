"""``faultdrill project --html DIR``: the projection's page, three plots and their tables (goodput
against scale per strategy, against the checkpoint interval, against spare nodes), then every
assumption with its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.project.command import PAGE_TITLE
from orchestrator.project.projection import Projection, Row
from orchestrator.report.html import Section, figure_png, write_page


def write_projection_page(projection: Projection, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = projection.failure_model
    largest = max(row.gpus for row in projection.rows)
    intro = [f"Failure model {model['name']}: {model['source']} (share of failures that take a node: "
             f"{model['node_share']:.2f}).",
             f"From the drill in {projection.measured['workdir']} (its largest run: {projection.measured['drill_gpus']} "
             f"GPUs or ranks); a checkpoint blocks {projection.measured['checkpoint_s']:.3g} s at the state size "
             f"asked. Goodput: training time / wall time (Meta's ETTR), the mean of the replicas, 95 % CI.",
             *(f"Note: {note}" for note in projection.notes)]
    sections = [_by_scale(projection, out_dir), _by_interval(projection, largest, out_dir),
                _by_spares(projection, largest, out_dir),
                Section("Assumed, not measured", None, [(["name", "value", "source"],
                                                         [[a["name"], a["value"], a["source"]]
                                                          for a in projection.assumptions])])]
    return write_page(out_dir, PAGE_TITLE, intro, sections)


def _best_of(rows: list[Row]) -> Row:
    return max(rows, key=lambda row: row.goodput)


def _strategies(projection: Projection) -> list[str]:
    return sorted({row.strategy for row in projection.rows})


def _by_scale(projection: Projection, out_dir: Path) -> Section:
    scales = sorted({row.gpus for row in projection.rows})
    best = {(strategy, gpus): _best_of([r for r in projection.rows if r.strategy == strategy and r.gpus == gpus])
            for strategy in _strategies(projection) for gpus in scales}

    def draw(axes: Any) -> None:
        for strategy in _strategies(projection):
            axes.plot(scales, [best[(strategy, gpus)].goodput for gpus in scales], marker="o", label=strategy)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("GPUs")
        axes.set_ylabel("goodput (best interval and spares)")
        axes.legend(loc="lower left")

    table = [[gpus, strategy, row.goodput, row.goodput_ci95, row.interval_s, row.spares, row.failures]
             for (strategy, gpus), row in sorted(best.items(), key=lambda item: (item[0][1], item[0][0]))]
    return Section("Goodput against scale, per strategy", figure_png(out_dir, "scale.png", draw),
                   [(["GPUs", "strategy", "goodput", "± 95 %", "interval s", "spares", "failures"], table)])


def _by_interval(projection: Projection, gpus: int, out_dir: Path) -> Section:
    rows = [row for row in projection.rows if row.gpus == gpus]
    curves: dict[str, list[Row]] = {}
    for strategy in _strategies(projection):
        mine = [row for row in rows if row.strategy == strategy]
        spares = _best_of(mine).spares
        curves[strategy] = sorted((row for row in mine if row.spares == spares), key=lambda row: row.interval_s)
    marks = [item for item in projection.best if item["gpus"] == gpus][:1]

    def draw(axes: Any) -> None:
        for strategy, curve in curves.items():
            axes.plot([row.interval_s for row in curve], [row.goodput for row in curve], marker="o", label=strategy)
        for mark in marks:
            axes.axvline(mark["young_interval_s"], linestyle=":", color="grey", label="Young")
            axes.axvline(mark["daly_interval_s"], linestyle="--", color="grey", label="Daly")
        axes.set_xscale("log")
        axes.set_xlabel("checkpoint interval, s")
        axes.set_ylabel(f"goodput at {gpus} GPUs")
        axes.legend(loc="lower left")

    table = [[strategy, row.spares, row.interval_s, row.goodput, row.goodput_ci95, row.lost_h["rework"],
              row.lost_h["checkpoints"]] for strategy, curve in curves.items() for row in curve]
    return Section(f"Goodput against the checkpoint interval, at {gpus} GPUs", figure_png(out_dir, "interval.png", draw),
                   [(["strategy", "spares", "interval s", "goodput", "± 95 %", "rework h", "checkpoint h"], table)])


def _by_spares(projection: Projection, gpus: int, out_dir: Path) -> Section:
    rows = [row for row in projection.rows if row.gpus == gpus]
    curves: dict[str, list[Row]] = {}
    for strategy in _strategies(projection):
        mine = [row for row in rows if row.strategy == strategy]
        counts = sorted({row.spares for row in mine})
        if len(counts) > 1:
            curves[strategy] = [_best_of([row for row in mine if row.spares == count]) for count in counts]

    def draw(axes: Any) -> None:
        if not curves:
            axes.text(0.5, 0.5, "no strategy with spare nodes projected", ha="center", va="center",
                      transform=axes.transAxes)
            axes.set_axis_off()
            return
        for strategy, curve in curves.items():
            axes.plot([row.spares for row in curve], [row.goodput for row in curve], marker="o", label=strategy)
        axes.set_xlabel("spare nodes")
        axes.set_ylabel(f"goodput at {gpus} GPUs (best interval)")
        axes.legend(loc="lower right")

    table = [[strategy, row.spares, row.goodput, row.goodput_ci95, row.new_jobs, row.interval_s]
             for strategy, curve in curves.items() for row in curve]
    return Section(f"Goodput against spare nodes, at {gpus} GPUs", figure_png(out_dir, "spares.png", draw),
                   [(["strategy", "spares", "goodput", "± 95 %", "new jobs", "interval s"], table)])
