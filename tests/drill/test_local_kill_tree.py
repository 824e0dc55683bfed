"""The local backend's end of a job's processes (kill_tree), with real processes: an in-allocation
job relaunches its ranks on the controller's go, possibly while the hung attempt's ranks are still
being killed; the kill must reach only that attempt's ranks (a CI run once saw the relaunched
attempt SIGKILLed: "rank launch exited with code 137"), and a cancelled job must leave nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from experiments.layout import ENV_ATTEMPT
from experiments.runtime.identity import start_ticks, ticks_now
from orchestrator.backends.local.backend import kill_tree

# A stand-in for submitit's local controller: starts ranks with the attempt in their environment,
# writes "<attempt> <pid>" per rank, and (RESPAWN) starts a rank again as soon as one ends (as
# attempt AGAIN).
CONTROLLER = r"""
import os, subprocess, sys, time
out, attempts, respawn, again = sys.argv[1], sys.argv[2].split(","), sys.argv[3] == "1", sys.argv[4]
def start(attempt):
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={**os.environ, "%(env)s": attempt})
    with open(out, "a") as f:
        f.write(f"{attempt} {rank.pid}\n")
    return rank
ranks = [start(a) for a in attempts]
while True:
    if respawn:
        os.wait()
        time.sleep(0.05)  # a relaunch starts after the controller's go, never in the 10 ms tick of the kill
        ranks.append(start(again))
    else:
        time.sleep(1)
""" % {"env": ENV_ATTEMPT}


def _start(tmp_path: Path, attempts: str, respawn: bool, ranks: int, again: str = "9") -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "ranks.txt"
    root = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(out), attempts, "1" if respawn else "0", again])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < ranks):
        time.sleep(0.02)
    assert out.exists() and len(out.read_text().splitlines()) >= ranks, "the stand-in controller started no ranks"
    return root, out


def _ranks(out: Path) -> list[tuple[str, int]]:
    return [(line.split()[0], int(line.split()[1])) for line in out.read_text().splitlines()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_past_the_tick_of(pid: int) -> None:
    """A drill decides a kill seconds after its ranks started; here the rank may be milliseconds old,
    and one started within the decision's 10 ms tick is spared by design (stop 31's CI)."""
    born = start_ticks(pid)
    deadline = time.monotonic() + 5
    while born is not None and ticks_now() <= born and time.monotonic() < deadline:
        time.sleep(0.005)
    assert born is None or ticks_now() > born


def _stop(root: subprocess.Popen, out: Path) -> None:
    for _, pid in _ranks(out):
        if _alive(pid):
            os.kill(pid, 9)
    root.kill()
    root.wait(timeout=10)


@pytest.fixture
def started(tmp_path: Path):
    begun: list[tuple[subprocess.Popen, Path]] = []

    def start(attempts: str, respawn: bool, ranks: int, again: str = "9") -> tuple[subprocess.Popen, Path]:
        begun.append(_start(tmp_path, attempts, respawn, ranks, again))
        return begun[-1]
    yield start
    for root, out in begun:
        if root.poll() is None:
            _stop(root, out)


def test_only_the_named_attempts_ranks_are_killed(started) -> None:
    root, out = started("0,0,1", respawn=False, ranks=3)
    kill_tree(psutil.Process(root.pid), include_root=False, attempt=0)
    by_attempt = {attempt: [_alive(pid) for a, pid in _ranks(out) if a == attempt] for attempt in ("0", "1")}
    assert by_attempt == {"0": [False, False], "1": [True]}, "the relaunched attempt's rank was killed"
    assert root.poll() is None, "the job's controller is left running"


def test_a_cancelled_job_that_starts_ranks_again_leaves_none_behind(started) -> None:
    root, out = started("0,0", respawn=True, ranks=2)
    kill_tree(psutil.Process(root.pid), include_root=True)
    root.wait(timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for _, pid in _ranks(out)):
        time.sleep(0.05)
    assert [pid for _, pid in _ranks(out) if _alive(pid)] == [], "a rank started during the kill outlived its job"


def test_a_rank_started_after_the_kill_began_is_spared_whatever_its_environment_says(started) -> None:
    """The relaunch starts its ranks once the hung ones are dead; between its fork and its exec a new
    rank still shows the job controller's environment, i.e. the job's first attempt: the one being
    killed (stop 16's CI: the relaunched attempt died of SIGKILL). Stood in for by ranks started
    again as attempt 0."""
    root, out = started("0", respawn=True, ranks=1, again="0")
    [(_, hung)] = _ranks(out)
    _wait_past_the_tick_of(hung)
    kill_tree(psutil.Process(root.pid), include_root=False, attempt=0, born_before=ticks_now())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_ranks(out)) < 2:
        time.sleep(0.02)
    relaunched = [pid for _, pid in _ranks(out)][1:]
    assert not _alive(hung) and relaunched and all(_alive(pid) for pid in relaunched), _ranks(out)


def test_a_cancelled_warm_job_ends_with_its_coordinator(tmp_path: Path) -> None:
    """Hardening issue, item 17: a warm job's controller hosts its coordinator, which starts spares
    when members die: a cancel that spared it left a job that planned a new generation after the
    controller had moved on. Stood in for by a controller that starts a task again whenever one ends."""
    from experiments.layout import ENV_WARM_WORLD
    from orchestrator.backends.local.backend import LocalBackend, LocalJobRecord

    out = tmp_path / "ranks.txt"
    root = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(out), "0", "1", "0"],
                            env={**os.environ, ENV_WARM_WORLD: "1"}, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (out.exists() and out.read_text().strip()):
            time.sleep(0.02)
        backend = LocalBackend("d1")
        backend._jobs[str(root.pid)] = LocalJobRecord(tmp_path, 1, root, "r000")
        backend.cancel(str(root.pid))
        root.wait(timeout=10)
        assert not [pid for _, pid in _ranks(out) if _alive(pid)], "a task outlived its cancelled job"
    finally:
        if root.poll() is None:
            _stop(root, out)
