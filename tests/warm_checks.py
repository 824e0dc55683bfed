"""What a run under restart.strategy warm must show — PyTorch's spares taking dead ranks' places
with a survivor's state, TensorFlow's and Chainer's whole spare sets restarting every rank — and
that a recovery's phases are the moments recorded for them: shared by the local drills (tests/unit) and the Slurm and PBS
drills (tests/cluster)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import psutil
from recovery_checks import assert_phases_follow_the_moments

from experiments.layout import ENV_RUN_DIR, ENV_WARM_COORDINATOR, RunPaths, attempt_event_lines
from experiments.warm.protocol import Line, new_secret, proof


def assert_peer_recoveries(run: dict[str, Any], run_dir: Path, faults: int | None = None) -> None:
    """PyTorch under warm: completed bit for bit as its twin, in one job; each fault answered by a
    warm spare and a survivor's state (no rollback: at most the interrupted step redone)."""
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
    assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every re-formation in the same job"
    assert run["recoveries"] and len(run["recoveries"]) == len(run["attempts"]) - 1
    if faults is not None:
        assert len(run["recoveries"]) == faults and all(f["outcome"] == "injected" for f in run["faults"]), run
    for recovery in run["recoveries"]:
        assert recovery["strategy"] == "warm" and recovery["state_source"] == "peer", recovery
        assert recovery["spare"].startswith("slot ") and recovery["lost_steps"] <= 1, recovery
        assert_phases_follow_the_moments(run, recovery, run_dir)


def assert_spare_sets_recovered(run: dict[str, Any], run_dir: Path, faults: int) -> None:
    """Completed bit for bit as its twin, in one job; each fault answered by a whole warm spare set
    (one process per rank, never a slot used twice) with a held survivor's state (no rollback: at
    most the interrupted step redone); every process of that set set up and waiting before the
    rank died (no cold start)."""
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
    assert len(run["faults"]) == faults and all(f["outcome"] == "injected" for f in run["faults"]), run["faults"]
    assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every restart in the same job"
    assert len(run["recoveries"]) == faults == len(run["attempts"]) - 1
    used: set[str] = set()
    for recovery in run["recoveries"]:
        assert recovery["strategy"] == "warm" and recovery["failure_class"] == "RANK_SIGNAL", recovery
        assert recovery["state_source"] == "peer" and recovery["lost_steps"] <= 1, recovery
        slots = recovery["spare"].split(",")
        assert len(slots) == run["ranks"] and not used & set(slots), recovery
        used |= set(slots)
        assert_phases_follow_the_moments(run, recovery, run_dir)
    plans = restart_plans(run_dir)
    assert len(plans) == faults, plans
    for plan in plans:
        assert all(warm_at < plan["failed_at"] for warm_at in plan["spares_warm_at"].values()), plan


def restart_plans(run_dir: Path) -> list[dict[str, Any]]:
    """The coordinator's plans after a failure (generation > 0), from the attempts' events."""
    paths = RunPaths(run_dir)
    attempts = sorted(int(path.name) for path in (run_dir / "attempts").iterdir() if path.name.isdigit())
    events = [event for attempt in attempts for event in attempt_event_lines(paths, attempt)]
    return [event for event in events if event.get("event") == "warm_plan" and event["generation"] > 0]


class Stranger:
    """Another user (security issue 28) who, while the drill under ``runs`` goes on, finds its warm
    coordinators (``coordinators``: host:port, of the test's own drill only) and knocks on each once."""

    def __init__(self, runs: Path) -> None:
        self.runs, self.probed, self._stop = runs.resolve(), set(), threading.Event()
        self._thread = threading.Thread(target=self._roam, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _roam(self) -> None:
        while not self._stop.wait(0.2):
            for address in self.coordinators() - self.probed:
                self.probed.add(address)
                knock(address)

    def coordinators(self) -> set[str]:
        raise NotImplementedError


class StrangerOnTheNodes(Stranger):
    """On a cluster: learns where the coordinators listen from the environment of the drill's own
    processes, as anyone who can read a job's environment could, and knocks across the network."""

    def coordinators(self) -> set[str]:
        found = set()
        for process in psutil.process_iter():
            try:
                environment = process.environ()
            except psutil.Error:
                continue
            run_dir, address = environment.get(ENV_RUN_DIR, ""), environment.get(ENV_WARM_COORDINATOR)
            if address and Path(run_dir).is_relative_to(self.runs):
                found.add(address)
        return found


def knock(address: str) -> None:
    """A hello for slot 99 with a proof made of a guessed secret; the coordinator should close it."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2) as connection:
            line = Line(connection)
            challenge = line.receive() or {}
            line.send({"op": "hello", "slot": 99, "node": "evil", "address": "10.6.6.6", "pid": 1,
                       "proof": proof(new_secret(), str(challenge.get("nonce", "")), 99, 1)})
            line.receive()
    except (OSError, ValueError):
        pass
