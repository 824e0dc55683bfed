"""How fast `faultdrill project` simulates (issue 25): 1,000 replicas of a 30-day job at 16,384 GPUs
(meta-rsc: MTTF 1.8 h) for 4 strategies x 5 intervals x 4 spare counts, all at once, against the
floor of one cell alone (the same lanes' arithmetic for 1/80 of them) in the same run. Goal: the
grid in <= 20 s on 2 cores.

    .venv/bin/python bench/project.py [--replicas 1000] [--out bench/results/project.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.project.failure_models import load_failure_model  # noqa: E402
from orchestrator.project.simulate import PHASES, Recovery, Scenario, daly_interval_s, simulate_many  # noqa: E402


def _recovery(seconds: dict[str, float], keeps_work: bool = False) -> Recovery:
    row = np.array([[seconds.get(phase, 0.0) for phase in PHASES]])
    return Recovery(row, keeps_work, np.array([1.0]) if keeps_work else None)


def grid(replicas: int) -> list[Scenario]:
    model = load_failure_model("meta-rsc")
    mttf_s, checkpoint_s = model.mttf_h(16384) * 3600, 30.0
    new_job = _recovery({"detect_s": 5, "resubmit_s": 1, "queue_s": 600, "startup_s": 60, "load_s": 20, "first_step_s": 5})
    in_place = _recovery({"detect_s": 5, "startup_s": 40, "load_s": 20, "first_step_s": 5})
    warm = _recovery({"detect_s": 1, "startup_s": 1, "first_step_s": 1}, keeps_work=True)
    requeue = _recovery({"detect_s": 5, "queue_s": 120, "startup_s": 60, "load_s": 20, "first_step_s": 5})
    cells = []
    for process, node in ((new_job, None), (requeue, None), (in_place, in_place), (warm, warm)):
        for factor in (0.5, 0.75, 1.0, 1.5, 2.0):
            for spares in (0, 1, 4, 16):
                cells.append(Scenario(30 * 86400, mttf_s, factor * daly_interval_s(checkpoint_s, mttf_s), checkpoint_s,
                                      process, new_job if node is not None else process, node=node,
                                      node_share=model.node_share, spares=spares if node is not None else 0))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "project.json")
    args = parser.parse_args()
    cells = grid(args.replicas)
    started = time.perf_counter()
    simulate_many(cells[:1], args.replicas, np.random.default_rng(0))
    one = time.perf_counter() - started
    started = time.perf_counter()
    outcomes = simulate_many(cells, args.replicas, np.random.default_rng(0))
    whole = time.perf_counter() - started
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "replicas": args.replicas,
              "cells": len(cells), "grid_s": round(whole, 2), "one_cell_s": round(one, 3),
              "grid_vs_one_cell": round(whole / one, 1), "goal_s": 20.0,
              "goodput_range": [round(min(o.goodput.mean() for o in outcomes), 3),
                                round(max(o.goodput.mean() for o in outcomes), 3)]}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
