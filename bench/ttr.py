"""Time to recover per framework x restart strategy for a rank SIGKILL, against a floor and a peer
tool measured in the same run, on this machine (local backend; issue 11).

- Faultdrill: one drill per framework x strategy, ``--faults`` rank SIGKILLs at random moments
  (exponential, after the first checkpoint, one after the other: ``repeat``); the ledger's phases.
- The floor: a cold start on the same resources (a fault-free run's first attempt: the job's start
  to its first step), per framework, in the same run. A restart cannot be cheaper than this
  without a warm process (issue 12).
- The peer: ``torchrun --standalone --max-restarts`` (PyTorch) on the same model, data and
  checkpoint interval, the same SIGKILL of one worker: ttr is the kill to the first step of the
  restarted workers; a restart that never trains again by the deadline counts as a failure.

Prints a table of medians and ratios (to the floor, and to torchrun), writes JSON beside it.

    .venv/bin/python bench/ttr.py [--frameworks torch,tensorflow,chainer] [--strategies resubmit,in-allocation]
                                  [--faults 5] [--out bench/results/ttr-local.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]
PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s")
PARAMS, BATCH, EVERY = 200_000, 16, 200
# Steps per framework: the faults come within the first few thousand; a run ends soon after.
STEPS = {"torch": 6000, "tensorflow": 4000, "chainer": 6000}


def _spec(workdir: Path, framework: str, strategy: str | None, faults: int, seed: int) -> Path:
    spec: dict[str, Any] = {
        "name": f"bench-ttr-{framework}-{strategy or 'floor'}", "backend": "local", "workdir": str(workdir),
        "workload": {"framework": framework, "model": "mlp", "params": PARAMS, "steps": STEPS[framework],
                     "seed": seed, "batch_size": BATCH},
        "checkpoint": {"every_steps": EVERY, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:30:00"},
        "restart": {"strategy": strategy or "resubmit", "max_restarts": faults + 2, "poll_interval_s": 0.05},
        "faults": [] if strategy is None else [
            {"kind": "kill-rank", "rank": 1, "signal": "SIGKILL", "anchor": "first_checkpoint",
             "after": {"exponential": 2.0, "max": 4.0}, "repeat": faults}],
        "parallel_runs": 1,
    }
    path = workdir.parent / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _drill(spec: Path) -> dict[str, Any]:
    done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json", "--no-html"], capture_output=True,
                          text=True, timeout=3600, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"bench: the drill {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def _events(workdir: Path, run_id: str, attempt: int) -> dict[str, float]:
    path = workdir / "runs" / run_id / "attempts" / str(attempt) / "events.jsonl"
    found: dict[str, float] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        found.setdefault(event["event"], float(event["time"]))
    return found


def cold_start_s(root: Path, framework: str) -> float:
    """A fault-free run's first attempt: job start -> first step (import, process group, model, step 1)."""
    workdir = root / f"floor-{framework}"
    report = _drill(_spec(workdir, framework, None, 0, seed=1))
    events = _events(workdir, report["runs"][0]["run_id"], 0)
    return events["first_step"] - events["job_start"]


def faultdrill_recoveries(root: Path, framework: str, strategy: str, faults: int) -> list[dict[str, Any]]:
    workdir = root / f"{framework}-{strategy}"
    report = _drill(_spec(workdir, framework, strategy, faults, seed=2))
    [run] = report["runs"]
    if run["status"] != "completed":
        raise SystemExit(f"bench: {framework}/{strategy} ended {run['status']}")
    return run["recoveries"]


# --- torchrun, the peer ----------------------------------------------------------------------------

TORCHRUN_SCRIPT = r'''
import json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
steps, every, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
torch.manual_seed(0)
width = int((%(params)d / 2) ** 0.5)
net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
model = nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
ckpt, start = out / "ckpt.pt", 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=False)
    net.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"]); start = state["step"]
log = open(out / f"steps-{rank}.jsonl", "a")
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(json.dumps({"pid": os.getpid(), "rank": rank, "restart": restart}), file=open(out / f"pid-{rank}-{restart}", "w"))
for step in range(start + 1, steps + 1):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(%(batch)d, width, generator=g)
    loss = nn.functional.mse_loss(model(x), torch.tanh(x))
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    log.write(json.dumps({"step": step, "time": time.time(), "restart": restart}) + "\n"); log.flush()
    if step %% every == 0 and rank == 0:
        tmp = out / ".ckpt.tmp"
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
        with open(tmp, "rb") as f: os.fsync(f.fileno())
        os.replace(tmp, ckpt)
dist.destroy_process_group()
''' % {"params": PARAMS, "batch": BATCH}


def _wait_for(condition: Any, deadline: float, poll: float = 0.02) -> bool:
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return False


def _steps(out: Path, rank: int) -> list[dict[str, Any]]:
    path = out / f"steps-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def torchrun_trial(root: Path, trial: int, rng: random.Random) -> dict[str, Any]:
    """One torchrun job, one worker SIGKILLed a random time after the first checkpoint."""
    out = root / f"torchrun-{trial}"
    out.mkdir(parents=True)
    script = out / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    steps = STEPS["torch"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                 "--nproc-per-node", "2", "--max-restarts", "3", str(script), str(steps), str(EVERY),
                                 str(out)], stdout=subprocess.DEVNULL, stderr=open(out / "torchrun.log", "w"),
                                env=env, start_new_session=True)
    try:
        if not _wait_for(lambda: (out / "ckpt.pt").exists(), time.monotonic() + 300):
            return {"recovered": False, "why": "no first checkpoint"}
        time.sleep(min(rng.expovariate(1 / 2.0), 4.0))
        victim = json.loads((out / "pid-1-0").read_text())["pid"]
        if victim not in {child.pid for child in psutil.Process(launcher.pid).children(recursive=True)}:
            return {"recovered": False, "why": f"pid {victim} is not a worker of our torchrun"}
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        last_before = max((s["step"] for s in _steps(out, 0) if s["restart"] == 0), default=0)
        recovered = _wait_for(lambda: any(s["restart"] > 0 for s in _steps(out, 0)), time.monotonic() + 120)
        if not recovered:
            return {"recovered": False, "why": "no step after the restart within 120 s"}
        first = min((s for s in _steps(out, 0) if s["restart"] > 0), key=lambda s: s["time"])
        launcher.wait(timeout=600)
        return {"recovered": launcher.returncode == 0, "ttr_s": first["time"] - killed_at,
                "lost_steps": last_before - (first["step"] - 1), "exit_code": launcher.returncode}
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


# --- the table ----------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default="torch,tensorflow,chainer")
    parser.add_argument("--strategies", default="resubmit,in-allocation")
    parser.add_argument("--faults", type=int, default=5, help="rank SIGKILLs per framework x strategy (and torchrun trials)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ttr-local.json")
    args = parser.parse_args()
    rng = random.Random(11)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ttr-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        peer: dict[str, Any] = {}
        frameworks = args.frameworks.split(",")
        if "torch" in frameworks:
            trials = [torchrun_trial(root, trial, rng) for trial in range(args.faults)]
            ok = [t for t in trials if t["recovered"]]
            peer = {"trials": trials, "success_rate": len(ok) / len(trials),
                    "ttr_s": _median([t["ttr_s"] for t in ok]), "lost_steps": _median([t["lost_steps"] for t in ok])}
        for framework in frameworks:
            floor = cold_start_s(root, framework)
            for strategy in args.strategies.split(","):
                recoveries = faultdrill_recoveries(root, framework, strategy, args.faults)
                row = {"framework": framework, "strategy": strategy, "faults": len(recoveries), "floor_s": floor,
                       **{phase: _median([r[phase] for r in recoveries]) for phase in PHASES},
                       "lost_steps": _median([r["lost_steps"] for r in recoveries])}
                row["ratio_to_floor"] = row["ttr_s"] / floor if row["ttr_s"] is not None else None
                row["ratio_to_torchrun"] = (row["ttr_s"] / peer["ttr_s"] if framework == "torch" and peer.get("ttr_s")
                                            else None)
                rows.append(row)
    _print(rows, peer)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d %H:%M"), "rows": rows, "torchrun": peer},
                                   indent=2))
    print(f"\nwritten: {args.out}")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _print(rows: list[dict[str, Any]], peer: dict[str, Any]) -> None:
    header = ["framework", "strategy", "faults", *(p.removesuffix("_s") for p in PHASES), "lost steps", "floor",
              "x floor", "x torchrun"]
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(_fmt(row[key]) for key in ("framework", "strategy", "faults", *PHASES, "lost_steps", "floor_s",
                                                    "ratio_to_floor", "ratio_to_torchrun")))
    if peer:
        print(f"torchrun --standalone --max-restarts 3: median ttr {_fmt(peer['ttr_s'])} s, lost steps "
              f"{_fmt(peer['lost_steps'])}, recovered {peer['success_rate']:.0%} of {len(peer['trials'])}")
    print("medians, seconds; floor: a cold start (job start to first step) of the same run, same machine")


if __name__ == "__main__":
    main()
