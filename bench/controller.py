"""What the controller costs as a sweep grows (issue 29): per round and per run-minute of CPU, its
RSS, and how fast it notices a failure, with 10 or 100 runs in flight in sweeps of 1,000 and 10,000.

The drill is the one ``faultdrill drill`` runs (the controller, its story, the live display and
``progress.json``), in this process, on the local backend, with ranks made as cheap as a real run
can be: a zero-code command (``sh``) that logs ``step N`` every 0.2 s. Every round the bench notes
the process's CPU time (the loop's thread and the controller's others: the scheduler poller, the
submission and injector pools), so a round's cost is what the process spent between two rounds.
After a warm-up (the first runs started) it measures for ``--window-s`` and stops the controller,
then cancels the sweep (``faultdrill cancel``): a 10,000-run sweep is measured while it runs, with
its runs waiting, in flight and finished, as a long sweep's controller lives.

Failures: every ``--kill-every-s`` the bench SIGKILLs 1 % of the runs in flight together (at least
one), each the rank process its run recorded (``attempts/N/rank-0.json``: pid and start time,
checked against /proc before the signal). A run's detection is the ledger's ``detected`` of the
killed attempt less the moment of the kill (one clock: this machine's).

Goals (BENCHMARKS.md): per round <= 1 ms + 0.05 ms per run in flight; a 10,000-run sweep's round
within +/-10 % of a 1,000-run sweep's at the same in-flight; detection's p99 within two rounds of
its median; RSS <= 500 MB at 10,000 runs.

    .venv/bin/python bench/controller.py [--in-flight 10 100] [--sweeps 1000 10000] [--window-s 60]
        [--out bench/results/controller.json]

1,000 in flight is not measured here: a local run is ~3 processes (the local executor's controller,
the task, the command), 1,000 of them ~100 GB on this 24 GiB, 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.states import JobState  # noqa: E402

STEP_S = 0.2  # the rank's pace: a line a step
# A run's first submission creates its directory, its fence's lock, its fence twice (before and after
# the scheduler's answer: each a new file renamed over the last), its submitit folder and its pickled call.
FILES_PER_SUBMISSION = 6
RANK = "i=0; while [ $i -lt {steps} ]; do i=$((i+1)); echo step $i; sleep " + f"{STEP_S}" + "; done"


@dataclass
class Round:
    at: float  # monotonic, when the round's work ended
    cpu_s: float  # the process's CPU time then
    loop_cpu_s: float  # the loop thread's alone (the observer runs on it)
    in_flight: int  # runs with an attempt out (on Slurm: a pending array element too)
    running: int  # of them, those whose job the scheduler last said runs


@dataclass
class Kill:
    run_id: str
    attempt: int
    at: float  # wall clock (the ledger's)


@dataclass
class Sampler:
    """The observer the bench puts beside the drill's own: a note per round."""

    rounds: list[Round] = field(default_factory=list)

    def __call__(self, touched: list[Any]) -> None:
        in_flight = [tracker for tracker in touched if _in_flight(tracker)]
        running = sum(1 for tracker in in_flight if tracker.watch.state is JobState.RUNNING)
        self.rounds.append(Round(time.monotonic(), time.process_time(), time.thread_time(), len(in_flight), running))


def _in_flight(tracker: Any) -> bool:
    return tracker.watch is not None and not tracker.done


def spec(root: Path, points: int, in_flight: int, run_s: float, backend: str = "local") -> Path:
    """The sweep: on Slurm its first attempts go out as job arrays (split at MaxArraySize, each
    throttled so that together at most ``in_flight`` run), as a sweep of 10,000 runs would."""
    steps = max(1, round(run_s / STEP_S))
    text = {
        "name": f"bench-controller-{points}-{in_flight}", "backend": backend, "workdir": str(root / "work"),
        "args": {"point": 0},
        "workload": {"command": ["sh", "-c", RANK.format(steps=steps)], "framework": "other", "steps": steps,
                     "progress": {"log": r"^step (\d+)"}},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "01:00:00"},
        "restart": {"max_restarts": 5},
        "sweep": {"grid": {"args.point": list(range(points))}},
        "baseline": False, "parallel_runs": in_flight, "submit_as_array": backend != "local",
    }
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_some(workdir: Path, trackers: list[Any], share: float) -> list[Kill]:
    """SIGKILL ``share`` of the runs in flight (at least one), each its recorded rank process if it
    is still the one the run recorded."""
    running = [t for t in trackers if _in_flight(t)]
    chosen = random.sample(running, max(1, math.ceil(share * len(running)))) if running else []
    kills = []
    for tracker in chosen:
        run_dir = workdir / "runs" / tracker.run.run_id
        try:
            attempt = int((run_dir / "current-attempt").read_text().split()[0])
            record = json.loads((run_dir / "attempts" / str(attempt) / "rank-0.json").read_text())
        except (OSError, ValueError):
            continue  # not started yet
        if record.get("left_at") is not None or _start_ticks(record["pid"]) != record["start_ticks"]:
            continue  # not the recorded process any more
        at = time.time()
        try:
            os.kill(record["pid"], signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills.append(Kill(tracker.run.run_id, attempt, at))
    return kills


def detections(ledger: Path, kills: list[Kill]) -> list[float]:
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        rows = {(run, attempt): detected for run, attempt, detected in
                db.execute("SELECT run_id, attempt, detected FROM attempts WHERE detected IS NOT NULL")}
    return [rows[(k.run_id, k.attempt)] - k.at for k in kills if (k.run_id, k.attempt) in rows]


def one_drill(points: int, in_flight: int, window_s: float, warmup_s: float, run_s: float,
              kill_every_s: float, fail_share: float, backend: str = "local") -> dict[str, Any]:
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.control.controller import Controller, plan_drill
    from orchestrator.control.detach import ControllerLock
    from orchestrator.control.progress import DrillProgress
    from orchestrator.control.workdir import prepare_workdir
    from orchestrator.record.ledger_home import place_ledger

    root = Path(tempfile.mkdtemp(prefix="fd-bench-controller-", dir="/var/tmp"))
    create_ms = create_floor_ms(root)
    campaign = load_campaign(spec(root, points, in_flight, run_s, backend))
    set_up_at = time.monotonic()
    plan = plan_drill(campaign)
    prepare_workdir(campaign)
    sampler, kills = Sampler(), []
    with ControllerLock(campaign.workdir):
        controller = Controller(campaign, plan=plan)
        set_up_s = time.monotonic() - set_up_at
        progress = DrillProgress(campaign.workdir)
        started = time.monotonic()
        # The arrays (Slurm) are out before the first round: the warm-up counts from it.
        first_round_at: float | None = None
        next_kill = ends_at = math.inf

        def observe(trackers: list[Any], touched: list[Any]) -> None:
            nonlocal next_kill, ends_at, first_round_at
            if first_round_at is None:
                first_round_at = time.monotonic()
                next_kill, ends_at = first_round_at + warmup_s, first_round_at + warmup_s + window_s
            progress(trackers, touched)
            sampler(touched)
            now = time.monotonic()
            if now >= next_kill and now < ends_at - 2 * kill_every_s:  # the last kills are detected in the window
                kills.extend(kill_some(campaign.workdir, touched, fail_share))
                next_kill = now + kill_every_s
            if now >= ends_at:
                controller.stop_requested.set()

        try:
            with progress:
                controller.run(observer=observe)
        finally:
            progress.close()
            controller.close()
    rounds = [r for r in sampler.rounds if first_round_at is not None and r.at >= first_round_at + warmup_s]
    costs_ms = [1000 * (b.cpu_s - a.cpu_s) for a, b in zip(rounds, rounds[1:], strict=False)]
    loop_ms = [1000 * (b.loop_cpu_s - a.loop_cpu_s) for a, b in zip(rounds, rounds[1:], strict=False)]
    gaps_ms = [1000 * (b.at - a.at) for a, b in zip(rounds, rounds[1:], strict=False)]
    mean_in_flight = statistics.fmean(r.in_flight for r in rounds) if rounds else 0.0
    mean_running = statistics.fmean(r.running for r in rounds) if rounds else 0.0
    per_minute_of = mean_in_flight if backend == "local" else mean_running
    window_cpu_s = rounds[-1].cpu_s - rounds[0].cpu_s if len(rounds) > 1 else 0.0
    window_wall_s = rounds[-1].at - rounds[0].at if len(rounds) > 1 else 0.0
    detected = sorted(detections(place_ledger(campaign.workdir, campaign.ledger_dir), kills))
    cancelled = subprocess.run([sys.executable, "-m", "orchestrator.cli", "cancel", str(campaign.workdir)],
                               capture_output=True, text=True, timeout=900, cwd=REPO)
    report_at = time.monotonic()  # the sweep's report, as a user asks it (a process of its own)
    reported = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(campaign.workdir)],
                              capture_output=True, text=True, timeout=900, cwd=REPO)
    report_s = time.monotonic() - report_at
    result = {
        "backend": backend, "points": points, "in_flight_limit": in_flight,
        "in_flight_mean": round(mean_in_flight, 1),
        "running_mean": round(mean_running, 1),
        "set_up_s": round(set_up_s, 2), "rounds": len(costs_ms),
        # the first attempts of every run accepted by the scheduler (Slurm: the arrays), from the
        # controller's start
        "submit_s": round(first_round_at - started, 2) if first_round_at is not None and backend != "local" else None,
        # the floor: the files a submission creates for each run (FILES_PER_SUBMISSION), one after another
        "create_floor_ms": round(create_ms, 3),
        "submit_floor_s": round(points * FILES_PER_SUBMISSION * create_ms / 1000, 2),
        "round_cpu_ms_median": round(statistics.median(costs_ms), 3) if costs_ms else None,
        "round_cpu_ms_mean": round(statistics.fmean(costs_ms), 3) if costs_ms else None,
        "round_cpu_ms_p99": round(_quantile(costs_ms, 0.99), 3) if costs_ms else None,
        # of it, the loop's own thread (the rest: the scheduler's poll and commands, clock reads)
        "round_loop_cpu_ms_median": round(statistics.median(loop_ms), 3) if loop_ms else None,
        "round_gap_ms_median": round(statistics.median(gaps_ms), 1) if gaps_ms else None,
        # per minute of a run in flight (Slurm: of a run whose job runs, not of a pending element)
        "cpu_s_per_run_minute": round(window_cpu_s / (per_minute_of * window_wall_s / 60), 4)
        if per_minute_of and window_wall_s else None,
        "goal_round_cpu_ms": round(1.0 + 0.05 * in_flight, 2),
        "rss_mb_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "kills": len(kills), "detected": len(detected),
        "detect_ms_median": round(1000 * statistics.median(detected), 1) if detected else None,
        "detect_ms_p99": round(1000 * _quantile(detected, 0.99), 1) if detected else None,
        "cancel_rc": cancelled.returncode,
        "report_s": round(report_s, 2), "report_rc": reported.returncode,
        "report_lines": len(reported.stdout.splitlines()),
        "workdir": str(campaign.workdir),
    }
    if cancelled.returncode == 0:
        subprocess.run(["rm", "-rf", "--", str(root)], check=False)
    return result


def create_floor_ms(directory: Path, files: int = 2000) -> float:
    """What creating one small file costs on ``directory``'s filesystem, one after another (create,
    write a line, close: as a fence or a pickled call is written), in ms: the floor of a
    submission that must leave a few files for each run."""
    floor_dir = Path(tempfile.mkdtemp(prefix="create-floor-", dir=directory))
    try:
        began = time.perf_counter()
        for index in range(files):
            fd = os.open(floor_dir / f"f{index}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"0 - drill\n")
            os.close(fd)
        return 1000 * (time.perf_counter() - began) / files
    finally:
        subprocess.run(["rm", "-rf", "--", str(floor_dir)], check=False)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--sweeps", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--run-s", type=float, default=60.0, help="how long a run trains (its steps at 0.2 s)")
    parser.add_argument("--kill-every-s", type=float, default=5.0)
    parser.add_argument("--fail-share", type=float, default=0.01)
    parser.add_argument("--backend", choices=("local", "slurm"), default="local",
                        help="slurm: the sweep's first attempts as job arrays on the cluster scripts/cluster starts")
    parser.add_argument("--one", type=int, nargs=2, metavar=("POINTS", "IN_FLIGHT"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "controller.json")
    args = parser.parse_args()
    if args.one:
        points, in_flight = args.one
        print(json.dumps(one_drill(points, in_flight, args.window_s, args.warmup_s, args.run_s, args.kill_every_s,
                                   args.fail_share, args.backend)))
        return
    results = []
    for in_flight in args.in_flight:
        for points in args.sweeps:
            # each drill in a process of its own: its RSS is its own, nothing of one drill left in the next
            print(f"bench: {points} runs, {in_flight} in flight ...", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, __file__, "--one", str(points), str(in_flight),
                                   *_passed(args)], stdout=subprocess.PIPE, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    for in_flight in args.in_flight:
        rows = {row["points"]: row for row in results if row["in_flight_limit"] == in_flight}
        small, large = rows.get(min(args.sweeps)), rows.get(max(args.sweeps))
        if small and large and small is not large and small["round_cpu_ms_median"]:
            large["round_cpu_vs_smallest_sweep"] = round(large["round_cpu_ms_median"] / small["round_cpu_ms_median"], 3)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                                    "args": {k: str(v) for k, v in vars(args).items()},
                                    "results": results}, indent=1) + "\n")
    _print_table(results)


def _passed(args: argparse.Namespace) -> list[str]:
    return ["--window-s", str(args.window_s), "--warmup-s", str(args.warmup_s), "--run-s", str(args.run_s),
            "--kill-every-s", str(args.kill_every_s), "--fail-share", str(args.fail_share), "--backend", args.backend]


def _print_table(results: list[dict[str, Any]]) -> None:
    head = ("runs", "in flight", "round CPU ms (median / p99)", "goal ms", "CPU s / run-min", "RSS MB",
            "detect ms (median / p99, n)", "round gap ms")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        print(f"| {r['points']} | {r['in_flight_mean']} ({r['in_flight_limit']}) | {r['round_cpu_ms_median']} / "
              f"{r['round_cpu_ms_p99']} | {r['goal_round_cpu_ms']} | {r['cpu_s_per_run_minute']} | {r['rss_mb_peak']} | "
              f"{r['detect_ms_median']} / {r['detect_ms_p99']}, {r['detected']} | {r['round_gap_ms_median']} |")


if __name__ == "__main__":
    main()
