"""A 1000-point sweep on the real Slurm cluster (scripts/cluster up), against a plain job array of
the same jobs in the same run (issue 11).

Faultdrill: a campaign of N runs of a trivial command workload (a script that logs one step and
exits: zero-code mode), ``submit_as_array`` with ``parallel_runs`` as the array's throttle, no
faults, no twins. Measured from the drill's own report and ledger:
- validate + render + submit: from ``faultdrill drill`` started to the last first attempt accepted
  (goal <= 2 s: one ``sbatch --array`` for the whole sweep);
- scheduler commands per poll (goal: 1, whatever the number of jobs) and controller CPU per poll;
- until all finished: from the drill started to the last job's end (sacct).
- CPU per element: Slurm's accounting (sacct TotalCPU) of the batch scripts and rank steps.
The floor: the same script in a plain ``sbatch --array=0-(N-1)%throttle`` (srun, as Faultdrill's
batch script does), from its submission to its last element's end (sacct), in the same run.

    scripts/cluster up
    .venv/bin/python bench/sweep.py [--points 1000] [--throttle 24] [--out bench/results/sweep.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.commands import run_command  # noqa: E402

SCRIPT = "print('step 1', flush=True)"  # the trivial training script: one step, logged
PARTITION = "debug"
SHARED = Path("/var/tmp")  # outside /tmp: the cluster's nodes have a private one


def faultdrill_sweep(root: Path, points: int, throttle: int) -> dict[str, Any]:
    spec = {
        "name": "bench-sweep", "backend": "slurm", "workdir": str(root / "work"),
        "args": {"point": 0},
        "workload": {"command": ["python", "-c", SCRIPT], "framework": "other", "steps": 1,
                     "progress": {"log": r"^step (\d+)"}},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "partition": PARTITION},
        "restart": {"max_restarts": 1},
        "sweep": {"grid": {"args.point": list(range(points))}},
        "baseline": False, "parallel_runs": throttle, "submit_as_array": True,
    }
    path = root / "bench-sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(path), "--format", "json",
                           "--no-html"], capture_output=True, text=True, timeout=7200, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"bench: the sweep's drill failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    first = [run["attempts"][0] for run in report["runs"]]
    job_ids = sorted({attempt["job_id"].split("_")[0] for attempt in first})
    cost = report["controller_cost"]
    polls = max(cost["scheduler_polls"], 1)
    return {
        "runs": len(report["runs"]), "completed": sum(run["status"] == "completed" for run in report["runs"]),
        "attempts": sum(len(run["attempts"]) for run in report["runs"]), "array_jobs": job_ids,
        "submit_s": max(attempt["accepted"] for attempt in first) - started,
        "all_finished_s": _last_end(job_ids) - started,
        "scheduler_polls": cost["scheduler_polls"], "commands_per_poll": cost["scheduler_poll_commands"] / polls,
        "controller_cpu_s": cost["controller_cpu_s"], "controller_cpu_ms_per_poll": 1000 * cost["controller_cpu_s"] / polls,
        "cpu_per_element": cpu_per_element(job_ids, points),
    }


def plain_array(root: Path, points: int, throttle: int) -> dict[str, Any]:
    script = root / "plain.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --job-name=bench-plain-array", f"#SBATCH --partition={PARTITION}",
        "#SBATCH --ntasks=1", "#SBATCH --time=00:10:00", f"#SBATCH --output={root}/plain-%A_%a.out",
        f"srun {sys.executable} -c \"{SCRIPT}\"", ""]))
    started = time.time()
    job_id = run_command(["sbatch", "--parsable", f"--array=0-{points - 1}%{throttle}", str(script)]).stdout.strip()
    submitted = time.time()
    _wait_gone(job_id)
    return {"array_job": job_id, "submit_s": submitted - started, "all_finished_s": _last_end([job_id]) - started,
            "cpu_per_element": cpu_per_element([job_id], points)}


def _wait_gone(job_id: str, deadline_s: float = 7200) -> None:
    """Until the array has no element queued or running (one squeue a second)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not run_command(["squeue", "-h", "-r", "-j", job_id, "-o", "%i"], check=False).stdout.strip():
            return
        time.sleep(1.0)
    raise SystemExit(f"bench: array {job_id} still queued after {deadline_s:g} s")


def _last_end(job_ids: list[str]) -> float:
    """The latest End (epoch s) sacct gives for the jobs' elements (asked until every one has one)."""
    for _ in range(60):
        out = run_command(["sacct", "-X", "-n", "-P", "-o", "JobID,End", "-j", ",".join(job_ids)]).stdout
        ends = [line.split("|")[1] for line in out.splitlines() if "|" in line]
        if ends and all(end not in ("Unknown", "") for end in ends):
            return max(datetime.fromisoformat(end).timestamp() for end in ends)
        time.sleep(1.0)
    raise SystemExit(f"bench: sacct has no end for every element of {job_ids}")


def cpu_per_element(job_ids: list[str], elements: int) -> dict[str, float]:
    """Slurm's accounting of the elements' CPU (sacct TotalCPU): their batch scripts' and their rank
    steps', each summed and divided by the elements (the allocation lines, which add the steps up,
    are not counted again)."""
    out = run_command(["sacct", "-n", "-P", "-o", "JobID,TotalCPU", "-j", ",".join(job_ids)]).stdout
    batch = ranks = 0.0
    for line in out.splitlines():
        job, _, total = line.partition("|")
        step = job.rpartition(".")[2] if "." in job else ""
        if step == "batch":
            batch += _slurm_seconds(total)
        elif step.isdigit():
            ranks += _slurm_seconds(total)
    return {"batch_s": batch / elements, "ranks_s": ranks / elements, "total_s": (batch + ranks) / elements}


def _slurm_seconds(text: str) -> float:
    """sacct's ``[D-][HH:]MM:SS[.mmm]`` in seconds (0 for an empty field)."""
    days, _, clock = text.strip().rpartition("-")
    parts = [float(part) for part in clock.split(":") if part] if clock else []
    seconds = sum(value * 60 ** index for index, value in enumerate(reversed(parts)))
    return seconds + 86400 * (int(days) if days else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--throttle", type=int, default=24, help="elements running at once (parallel_runs)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sweep.json")
    args = parser.parse_args()
    if subprocess.run([str(REPO / "scripts" / "cluster"), "status"], capture_output=True).returncode != 0:
        raise SystemExit("bench: the cluster is not up (scripts/cluster up)")
    with tempfile.TemporaryDirectory(prefix="bench-sweep-", dir=SHARED) as tmp:
        root = Path(tmp)
        plain = plain_array(root, args.points, args.throttle)
        drilled = faultdrill_sweep(root, args.points, args.throttle)
    ratio = drilled["all_finished_s"] / plain["all_finished_s"]
    print(f"{args.points} points, throttle {args.throttle}, on the cluster of scripts/cluster")
    print("what | faultdrill | plain sbatch --array | goal")
    print(f"validate + render + submit, s | {drilled['submit_s']:.2f} | {plain['submit_s']:.2f} (sbatch alone) | <= 2")
    print(f"until all finished, s | {drilled['all_finished_s']:.1f} | {plain['all_finished_s']:.1f} | x {ratio:.2f}")
    mine, theirs = drilled["cpu_per_element"], plain["cpu_per_element"]
    print(f"CPU per element (sacct: batch + ranks), s | {mine['total_s']:.3f} ({mine['batch_s']:.3f} + "
          f"{mine['ranks_s']:.3f}) | {theirs['total_s']:.3f} ({theirs['batch_s']:.3f} + {theirs['ranks_s']:.3f}) |")
    print(f"scheduler polls | {drilled['scheduler_polls']} | - |")
    print(f"scheduler commands per poll | {drilled['commands_per_poll']:.2f} | - | 1")
    print(f"controller CPU per poll, ms | {drilled['controller_cpu_ms_per_poll']:.1f} | - |")
    print(f"runs completed | {drilled['completed']}/{drilled['runs']} in {len(drilled['array_jobs'])} array job(s) | |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d %H:%M"), "points": args.points,
                                    "throttle": args.throttle, "faultdrill": drilled, "plain": plain,
                                    "finished_ratio": ratio}, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
