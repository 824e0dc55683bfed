"""Time to recover per framework x restart strategy x fault, local and on the real Slurm cluster,
against a floor and the tools users would otherwise pick, measured in the same run (issue 11).

- Faultdrill: one drill per backend x framework x strategy x fault kind, ``--faults`` faults one
  after the other (``repeat``), each at a random moment after a checkpoint; the ledger's phases.
  Kinds: ``kill-rank`` (SIGKILL of rank 1), ``node-crash`` (Slurm: the job's last node, back 45 s
  later, once Slurm has declared it down; in-allocation holds a spare node), ``preempt`` (the warning, a checkpoint, the job ended;
  the requeue strategy requeues it).
- The floor: a cold start on the same resources (a fault-free run's job start to its first step),
  per backend x framework, in the same run. No restart in a new process can be cheaper.
- The peers (bench/peers.py): ``torchrun --standalone --max-restarts`` on a rank SIGKILL (local),
  Slurm's ``--requeue`` on a node crash, submitit's ``Checkpointable`` on a preemption (Slurm).

Prints a table of medians and ratios (to the floor, and to the best peer on the same fault), writes
JSON beside it. Goals: every strategy at or below the best peer on the same fault; after a node
crash, resubmit and in-allocation >= 20x faster than Slurm's requeue.

    .venv/bin/python bench/ttr.py [--backends local,slurm] [--frameworks torch,tensorflow,chainer]
        [--strategies resubmit,in-allocation,requeue] [--kinds kill-rank,node-crash,preempt]
        [--faults 3] [--peer-trials 3] [--out bench/results/ttr.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

import peers
from experiments.layout import RunPaths, read_attempt_events

REPO = Path(__file__).resolve().parents[1]
FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]
PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s", "ttr_s")
PARAMS, BATCH, EVERY = 200_000, 16, 200
# Steps per framework: the faults come within the first few thousand; a run ends soon after.
STEPS = {"torch": 6000, "tensorflow": 4000, "chainer": 6000}
PARTITION = "debug"
# A node crash lasts past Slurm's SlurmdTimeout (the cluster's: 10 s, DOWN ~30 s after): Slurm's own
# requeue only acts on a node it has declared down (a node back within 10 s: it never noticed).
NODE_DOWN_S = 45
SHARED = Path("/var/tmp")  # outside /tmp: the cluster's nodes have a private one
PEER_OF = {"kill-rank": "torchrun --standalone --max-restarts", "node-crash": "Slurm --requeue",
           "preempt": "submitit Checkpointable"}


# warm, TensorFlow and Chainer: a used spare set is replaced by a new one, which takes ~8 s to set up
# here (TensorFlow, 2 busy cores); the job holds two (a PyTorch spare too: its replacement is a cold
# start, ~3 s), and faults 5-8 s apart always find one warm
# (sooner, they would measure the wait for a set).
SET_WARM_UP = {"exponential": 2.0, "min": 5.0, "max": 8.0}
RESTART_ALL = ("tensorflow", "chainer")


def _restarts_all(framework: str, strategy: str | None) -> bool:
    return strategy == "warm" and framework in RESTART_ALL


def _fault(kind: str, strategy: str, faults: int, framework: str) -> dict[str, Any]:
    after = SET_WARM_UP if _restarts_all(framework, strategy) else {"exponential": 2.0, "max": 4.0}
    fault: dict[str, Any] = {"kind": kind, "anchor": "first_checkpoint", "after": after, "repeat": faults}
    if kind == "kill-rank":
        fault.update(rank=1, signal="SIGKILL")
    elif kind == "node-crash":
        fault.update(node=-1, down_s=NODE_DOWN_S)
    elif kind == "preempt":
        fault.update(grace_s=30, then="requeue" if strategy == "requeue" else "cancel")
    return fault


def _length(framework: str, strategy: str | None, kind: str | None, faults: int) -> int:
    """How many times STEPS a drill runs: a whole spare set's faults come 5-8 s apart; a node crash
    is followed by the next only once the crashed node is back (NODE_DOWN_S): a run that recovers in
    seconds would otherwise end before its second crash (measured: 42 s after the first)."""
    if _restarts_all(framework, strategy):
        return max(1, faults // 2)
    return faults if kind == "node-crash" else 1


def _spec(workdir: Path, backend: str, framework: str, strategy: str | None, kind: str | None,
          faults: int, seed: int) -> Path:
    """A drill of one framework x strategy x kind (``strategy`` None: the fault-free floor run)."""
    slurm = backend == "slurm"
    resources: dict[str, Any] = {"nodes": 2 if slurm else 1, "tasks_per_node": 1 if slurm else 2, "time": "00:30:00"}
    if slurm:
        resources["partition"] = PARTITION
    if kind == "node-crash":
        resources["extra_directives"] = ["--exclusive"]  # a crash must not take another run's job with it
        resources["spare_nodes"] = 1 if strategy == "in-allocation" else 0
    spec: dict[str, Any] = {
        "name": f"bench-ttr-{backend}-{framework}-{strategy or 'floor'}-{kind or 'none'}", "backend": backend,
        "workdir": str(workdir),
        "workload": {"framework": framework, "model": "mlp", "params": PARAMS,
                     "steps": STEPS[framework] * _length(framework, strategy, kind, faults),
                     "seed": seed, "batch_size": BATCH},
        "checkpoint": {"every_steps": EVERY, "keep": 2},
        "resources": resources,
        "restart": {"strategy": strategy or "resubmit", "max_restarts": faults + 2, "poll_interval_s": 0.05,
                    **({"warm_spares": 2} if strategy == "warm" else {})},
        "faults": [] if strategy is None or kind is None else [_fault(kind, strategy, faults, framework)],
        "parallel_runs": 1,
    }
    path = workdir.parent / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _valid(spec: Path) -> str | None:
    """None if Faultdrill takes the spec; else why not (a strategy a backend refuses, say)."""
    done = subprocess.run([*FAULTDRILL, "validate", str(spec)], capture_output=True, text=True, cwd=REPO)
    return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def _drill(spec: Path) -> dict[str, Any]:
    done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json", "--no-html"], capture_output=True,
                          text=True, timeout=7200, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"bench: the drill {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def cold_start_s(root: Path, backend: str, framework: str) -> float:
    """A fault-free run's first attempt: job start -> first step (import, process group, model, step 1)."""
    workdir = root / f"floor-{backend}-{framework}"
    report = _drill(_spec(workdir, backend, framework, None, None, 0, seed=1))
    events: dict[str, float] = {}
    for event in read_attempt_events(RunPaths(workdir / "runs" / report["runs"][0]["run_id"]), 0):
        events.setdefault(event.name, event.time)
    started = events.get("job_start", events.get("process_start"))  # the local backend has no batch script
    return events["first_step"] - started


def faultdrill_row(root: Path, backend: str, framework: str, strategy: str, kind: str, faults: int,
                   floor: float) -> dict[str, Any] | None:
    workdir = root / f"{backend}-{framework}-{strategy}-{kind}"
    spec = _spec(workdir, backend, framework, strategy, kind, faults, seed=2)
    refused = _valid(spec)
    if refused:
        print(f"  skipped {backend}/{framework}/{strategy}/{kind}: {refused}", file=sys.stderr)
        return None
    try:
        [run] = _drill(spec)["runs"]
    except SystemExit as failed:  # one combination's failure is a row of the table, not the end of the bench
        print(f"  {backend}/{framework}/{strategy}/{kind}: {failed}", file=sys.stderr, flush=True)
        return {"backend": backend, "framework": framework, "strategy": strategy, "kind": kind,
                "error": str(failed)[-500:]}
    if run["status"] != "completed":
        return {"backend": backend, "framework": framework, "strategy": strategy, "kind": kind,
                "error": f"the run ended {run['status']}"}
    recoveries = run["recoveries"]
    row = {"backend": backend, "framework": framework, "strategy": strategy, "kind": kind, "faults": len(recoveries),
           "floor_s": floor, **{phase: _median([r[phase] for r in recoveries]) for phase in PHASES},
           "lost_steps": _median([r["lost_steps"] for r in recoveries]),
           # where each recovery's state came from (warm: "peer", a survivor's; else the checkpoint), and
           # whether the run ended as its twin: what a warm row's claims stand on, kept beside its figures
           "state_sources": sorted({str(r.get("state_source")) for r in recoveries}),
           "identical_to_twin": run.get("identical_to_baseline")}
    row["ratio_to_floor"] = row["ttr_s"] / floor if row["ttr_s"] is not None else None
    return row


def peer_rows(root: Path, kinds: list[str], backends: list[str], trials: int, rng: random.Random) -> dict[str, Any]:
    """The best-known peer for each fault kind, ``trials`` times (those the chosen backends allow)."""
    workload = peers.Workload(params=PARAMS, batch=BATCH, every=EVERY, steps=STEPS["torch"])
    found: dict[str, Any] = {}
    for kind in kinds if trials > 0 else []:
        if kind == "kill-rank" and "local" in backends:
            results = [peers.torchrun_trial(root, t, workload, rng) for t in range(trials)]
        elif kind == "node-crash" and "slurm" in backends:
            results = [peers.slurm_requeue_trial(root, t, workload, PARTITION, down_s=NODE_DOWN_S) for t in range(trials)]
        elif kind == "preempt" and "slurm" in backends:
            results = [peers.checkpointable_trial(root, t, workload, PARTITION) for t in range(trials)]
        else:
            continue
        print(f"  peer on {kind}: {results}", file=sys.stderr, flush=True)
        ok = [r for r in results if r["recovered"]]
        found[kind] = {"peer": PEER_OF[kind], "trials": results, "success_rate": len(ok) / len(results),
                       "ttr_s": _median([r["ttr_s"] for r in ok]), "lost_steps": _median([r["lost_steps"] for r in ok])}
    return found


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="local")
    parser.add_argument("--frameworks", default="torch,tensorflow,chainer")
    parser.add_argument("--strategies", default="resubmit,in-allocation,requeue")
    parser.add_argument("--kinds", default="kill-rank,node-crash,preempt")
    parser.add_argument("--faults", type=int, default=3, help="faults per drill (framework x strategy x kind)")
    parser.add_argument("--peer-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ttr.json")
    args = parser.parse_args()
    backends, kinds = args.backends.split(","), args.kinds.split(",")
    rng = random.Random(11)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ttr-", dir=SHARED) as tmp:
        root = Path(tmp)
        found_peers = peer_rows(root, kinds, backends, args.peer_trials, rng)
        for backend in backends:
            for framework in args.frameworks.split(","):
                floor = cold_start_s(root, backend, framework)
                for kind in kinds:
                    for strategy in args.strategies.split(","):
                        row = faultdrill_row(root, backend, framework, strategy, kind, args.faults, floor)
                        if row is not None:
                            print(f"  {backend}/{framework}/{strategy}/{kind}: ttr {row.get('ttr_s')}",
                                  file=sys.stderr, flush=True)
                            peer = found_peers.get(kind, {}).get("ttr_s")
                            ttr = row.get("ttr_s")
                            row["ratio_to_peer"] = ttr / peer if peer and ttr is not None else None
                            rows.append(row)
                            _write(args.out, rows, found_peers)  # what is measured survives a later failure
    _print(rows, found_peers)
    _write(args.out, rows, found_peers)
    print(f"\nwritten: {args.out}")


def _write(out: Path, rows: list[dict[str, Any]], found_peers: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d %H:%M"), "slurm": _slurm_settings(),
                               "rows": rows, "peers": found_peers}, indent=2))


def _slurm_settings() -> dict[str, str]:
    """What the cluster's Slurm says of the settings that pace its own recovery (the requeue's hold is
    ``cred_expire`` + 1 s; a node is down after SlurmdTimeout): the peer's figure depends on them."""
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    wanted = ("AuthInfo", "SlurmdTimeout", "KillWait", "MessageTimeout")
    found = (line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in found if key.strip() in wanted}


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _print(rows: list[dict[str, Any]], found_peers: dict[str, Any]) -> None:
    header = ["backend", "framework", "strategy", "fault", "faults", *(p.removesuffix("_s") for p in PHASES),
              "lost steps", "floor", "x floor", "x peer"]
    print(" | ".join(header))
    for row in rows:
        if "error" in row:
            print(" | ".join(_fmt(row[key]) for key in ("backend", "framework", "strategy", "kind")) + f" | FAILED: {row['error']}")
            continue
        print(" | ".join(_fmt(row[key]) for key in ("backend", "framework", "strategy", "kind", "faults", *PHASES,
                                                    "lost_steps", "floor_s", "ratio_to_floor", "ratio_to_peer")))
    for kind, peer in found_peers.items():
        print(f"peer on {kind}: {peer['peer']}: median ttr {_fmt(peer['ttr_s'])} s, lost steps "
              f"{_fmt(peer['lost_steps'])}, recovered {peer['success_rate']:.0%} of {len(peer['trials'])}")
    print("medians, seconds; floor: a cold start (job start to first step) of the same run, same machine")


if __name__ == "__main__":
    main()
