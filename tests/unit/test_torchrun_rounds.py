"""restart.strategy elastic on the rank side (experiments/runtime/torchrun.py WorkerRegistry): how a
node tells torchrun's rounds of workers apart, against a stand-in launcher that starts real worker
processes (the environment torchrun gives them) and starts them all again on request. Review
findings: a round whose workers came and went between two looks was never counted (the nodes then
disagree on the attempt); a round the controller had moved the run past was still registered, over
the next attempt's files; under c10d a node may be given another node's ranks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from experiments.layout import CommandSpec, RunPaths
from experiments.runtime.distenv import DistEnv
from experiments.runtime.torchrun import WorkerRegistry, rendezvous_id

pytestmark = pytest.mark.drill  # starts processes

# Starts its workers (sleepers with torchrun's variables), and all of them again on each SIGUSR1.
LAUNCHER = """
import os, signal, subprocess, sys, time
ranks = [int(rank) for rank in sys.argv[2].split(",")]
workers = []
def start(*_):
    for worker in workers:
        worker.kill(); worker.wait()
    workers[:] = [subprocess.Popen(["sleep", "60"], env={**os.environ, "TORCHELASTIC_RUN_ID": sys.argv[1],
                                                         "RANK": str(rank)}) for rank in ranks]
signal.signal(signal.SIGUSR1, start)
start()
while True:
    time.sleep(0.01)
"""


@pytest.fixture
def launcher(request: pytest.FixtureRequest) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(ranks: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", LAUNCHER, rendezvous_id("r000", 0), ranks],
                                   start_new_session=True)
        started.append(process)
        return process

    yield start
    for process in started:
        subprocess.run(["pkill", "-KILL", "-s", str(process.pid)], check=False)  # its session: our own workers
        process.kill()
        process.wait()


def _registry(tmp_path: Path, launcher_pid: int, node_rank: int = 0,
              on_round: Callable[[int, int, float], bool] | None = None) -> WorkerRegistry:
    env = DistEnv(rank=node_rank, local_rank=0, world_size=2, node_rank=node_rank, num_nodes=2,
                  master_addr="127.0.0.1", master_port=29400, job_id="j1", node=f"n{node_rank}", scheduler="local")
    command = CommandSpec(argv=("t.py",), torchrun=("torchrun",), torchrun_ranks=4)
    return WorkerRegistry(RunPaths(tmp_path), env, command, 0, "r000", launcher_pid, elastic=True,
                          on_round=on_round or (lambda round_, rank, at: True))


def _until(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def test_rounds_that_come_while_the_fence_is_being_moved_are_each_counted(tmp_path: Path, launcher) -> None:
    rounds: list[int] = []

    def slow_fence(round_: int, rank: int, at: float) -> bool:
        time.sleep(0.8)  # the main node moving the fence (its lock, an fsync), or another waiting for it
        rounds.append(round_)
        return True

    process = launcher("0,1")
    registry = _registry(tmp_path, process.pid, on_round=slow_fence)
    registry.start()
    try:
        _until(lambda: len(registry.registered) == 2)
        process.send_signal(signal.SIGUSR1)  # round 1
        _until(lambda: registry.round == 1)
        process.send_signal(signal.SIGUSR1)  # round 2, while round 1's fence is still being moved
        _until(lambda: rounds == [1, 2] and len(registry.registered) == 2)
        identities = [json.loads(RunPaths(tmp_path).rank_file(2, rank).read_text()) for rank in (0, 1)]
        assert {identity["pid"] for identity in identities} == set(registry.registered)
    finally:
        registry.stop()


def test_a_round_the_controller_moved_past_is_not_registered(tmp_path: Path, launcher) -> None:
    process = launcher("0,1")
    registry = _registry(tmp_path, process.pid, on_round=lambda round_, rank, at: False)
    registry.start()
    try:
        _until(lambda: len(registry.registered) == 2)
        process.send_signal(signal.SIGUSR1)
        _until(lambda: registry.round == 1)
        time.sleep(0.3)  # several looks: nothing of round 1 may be written
        assert not RunPaths(tmp_path).rank_file(1, 0).exists() and not registry.registered
    finally:
        registry.stop()


def test_workers_of_another_nodes_place_end_the_launch_and_say_why(tmp_path: Path, launcher) -> None:
    process = launcher("0,1")  # c10d gave this node (the job's node 1, ranks 2-3) ranks 0-1
    registry = _registry(tmp_path, process.pid, node_rank=1)
    registry.start()
    try:
        process.wait(timeout=10)  # ended by the registry
        assert registry.misplaced is not None and "orders the nodes by host name" in registry.misplaced
        assert not registry.registered
    finally:
        registry.stop()
