"""How close a step-anchored kill lands to its step in zero-code mode (issue 27, item 4).

A script that knows nothing of Faultdrill (experiments/examples/torchrun_ddp.py: a plain DDP loop,
its steps printed, ``--step-s`` the least time a step takes, ``--step-log`` the step each rank ran
and when) is drilled with ``kill-rank after: {at_step: K}``, on the local backend, launched directly
or under torchrun. The floor is one step: the script's own log says which step it had reached when
the kill came (the fault's time), and the lateness is that step minus K, in steps (ratio to the
floor of one step, measured in the same run). The report's ``met step`` (from the heartbeats the
drill inferred from the script's lines) is printed beside it. Goal: within one step for steps of
>= 20 ms.

    .venv/bin/python bench/at_step.py [--step-s 0.02 0.05 0.2] [--launchers direct,torchrun]
        [--trials 3] [--out bench/results/at_step.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "examples" / "torchrun_ddp.py"
FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]
AT_STEP = 60


def _spec(workdir: Path, step_s: float, launcher: str) -> dict[str, Any]:
    command = [str(SCRIPT), "--steps", "{steps}", "--every", "1000", "--step-s", str(step_s), "--step-log", "{run_dir}"]
    command = ["torchrun", "--nproc-per-node=1", *command] if launcher == "torchrun" else ["python", *command]
    return {"name": "at-step", "backend": "local", "workdir": str(workdir),
            "workload": {"framework": "torch", "steps": AT_STEP + int(3.0 / step_s) + 20, "command": command,
                         "progress": {"log": r"^step (\d+)"}},
            "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
            "faults": [{"kind": "kill-rank", "after": {"at_step": AT_STEP}, "rank": 0}],
            "restart": {"max_restarts": 2, "poll_interval_s": 0.05}}


def trial(step_s: float, launcher: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(_spec(Path(tmp) / "work", step_s, launcher)))
        done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json", "--no-html"], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        [run] = json.loads(done.stdout)["runs"]
        [fault] = run["faults"]
        lines = (Path(tmp) / "work" / "runs" / run["run_id"] / "steps-0.log").read_text().splitlines()
        first_pid = lines[0].split()[0]
        actual = max(int(step) for pid, step, at in (line.split() for line in lines)
                     if pid == first_pid and float(at) <= fault["at"])
        return {"step_s": step_s, "launcher": launcher, "planned": fault["planned_step"], "met": fault["met_step"],
                "actual": actual, "late_steps": actual - AT_STEP}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-s", type=float, nargs="+", default=[0.02, 0.05, 0.2])
    parser.add_argument("--launchers", default="direct,torchrun")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "at_step.json")
    args = parser.parse_args()
    results = [trial(step_s, launcher) for step_s in args.step_s for launcher in args.launchers.split(",")
               for _ in range(args.trials)]
    print(f"{'launcher':<9} {'step s':>7} {'planned':>8} {'met (report)':>13} {'reached (log)':>14} "
          f"{'late / 1 step':>14}")
    for step_s in args.step_s:
        for launcher in args.launchers.split(","):
            group = [r for r in results if r["step_s"] == step_s and r["launcher"] == launcher]
            late = statistics.median(r["late_steps"] for r in group)
            print(f"{launcher:<9} {step_s:>7.3f} {AT_STEP:>8} {statistics.median(r['met'] for r in group):>13.0f} "
                  f"{statistics.median(r['actual'] for r in group):>14.0f} {late:>14.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
