"""The crash-point harness's second mode (issue 21): the controller is a real process, SIGKILLed
right after a side effect (tests/crash_child.py), then another is started on the workdir. What a
raise cannot show shows here: no ``finally`` runs, the ledger's open transaction and the threads
die with the process. The same drills and invariants as tests/unit/test_crash_points.py
(tests/crash_harness.py); CI kills it after every 13th crossing (from an offset that changes every
day, so that CI runs cover every crossing in turn), FAULTDRILL_FULL=1 after every one."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crash_harness import DRILLS, backoff_of, check, crash_workdirs, outcome, spec_file, world_for
from faultdrill_cli import full_campaigns
from simulated_cluster import SimulatedCluster

CHILD = Path(__file__).resolve().parents[1] / "crash_child.py"
EVERY_IN_CI = 13


def _controller(spec: Path, world_file: Path, crash_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), str(spec), str(world_file), str(crash_at)],
                          capture_output=True, text=True, timeout=120)


def _world(world_file: Path) -> SimulatedCluster:
    world: SimulatedCluster = pickle.loads(world_file.read_bytes())
    return world


@pytest.mark.parametrize("name", ["resubmit", "warm"])
def test_a_controller_sigkilled_after_any_side_effect_is_followed_by_one_that_ends_the_drill_the_same(
        tmp_path: Path, name: str) -> None:
    drill = DRILLS[name]
    with crash_workdirs(tmp_path) as workdirs:
        spec = spec_file(workdirs / "clean", drill)
        world_file = workdirs / "clean" / "world.pickle"
        world_file.write_bytes(pickle.dumps(world_for(spec, drill)))
        clean = _controller(spec, world_file, 0)
        assert clean.returncode == 0, clean.stderr[-3000:]
        total = int(clean.stdout.split()[-1])
        expected = outcome(spec)
        check(_world(world_file), expected, expected, "(no crash)", backoff_of(drill))
        assert {status for status, *_ in expected.values()} == {"completed"} and total > 20

        first = 1 if full_campaigns() else 1 + int(time.time() // 86400) % EVERY_IN_CI
        crash_points = range(first, total + 1, 1 if full_campaigns() else EVERY_IN_CI)
        for crash_at in crash_points:
            spec = spec_file(workdirs / f"crash-{crash_at}", drill)
            world_file = spec.parent / "world.pickle"
            world_file.write_bytes(pickle.dumps(world_for(spec, drill)))
            killed = _controller(spec, world_file, crash_at)
            where = f"(SIGKILLed after crossing {crash_at} of {total})"
            assert killed.returncode == -9, f"{killed.returncode} {where}: {killed.stderr[-2000:]}"
            world = _world(world_file)
            world.tick()  # the cluster goes on while no controller is there
            world_file.write_bytes(pickle.dumps(world))
            resumed = _controller(spec, world_file, 0)
            assert resumed.returncode == 0, f"{where}: {resumed.stderr[-3000:]}"
            check(_world(world_file), outcome(spec), expected, where, backoff_of(drill))
        print(f"crash points, SIGKILL mode, {name}: {len(crash_points)} of {total} crossings")
