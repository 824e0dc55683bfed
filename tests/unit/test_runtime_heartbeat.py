import os
from pathlib import Path

import psutil
import pytest
from clocks import ManualClock

from experiments.layout import RankIdentity, RunPaths, read_json_lines
from experiments.runtime.digest import digest_arrays
from experiments.runtime.distenv import DistEnv
from experiments.runtime.events import EventLog
from experiments.runtime.heartbeat import HeartbeatWriter
from experiments.runtime.identity import matches_process, write_identity
from experiments.workloads import UnknownFrameworkError, get_workload


def test_heartbeats_are_rate_limited_but_forced_ones_always_land(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "hb" / "rank-0.jsonl"
    writer = HeartbeatWriter(path, attempt=2, interval_s=1.0, clock=clock)
    assert writer.beat(0)
    for step in range(1, 10):
        clock.now += 0.3
        writer.beat(step, force=step == 5)
    lines = read_json_lines(path)
    # t=0 step 0; forced step 5; then 1 s after the last write: step 9 (t=2.7 vs 1.5).
    assert [line["step"] for line in lines] == [0, 4, 5, 9]
    assert all(line["attempt"] == 2 for line in lines)
    assert lines[1]["time"] == pytest.approx(1001.2)


def test_identity_written_and_verifiable(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    env = DistEnv.from_environ({}, hostname="h")
    identity = write_identity(paths, env, attempt=3)
    assert paths.rank_file(3, 0).exists()
    assert identity.pid == os.getpid()
    assert identity.create_time == psutil.Process().create_time()
    assert matches_process(identity)
    # /proc/<pid>/stat's 22nd field (after the parenthesised command name: its 20th), read here by hand.
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    assert identity.start_ticks == int(stat.rsplit(")", 1)[1].split()[19])
    reused = RankIdentity(**{**identity.__dict__, "start_ticks": identity.start_ticks - 100})
    assert not matches_process(reused)


def test_event_log_only_on_rank0(tmp_path: Path) -> None:
    EventLog(tmp_path / "a.jsonl", enabled=True).emit("first_step", step=3)
    EventLog(tmp_path / "b.jsonl", enabled=False).emit("first_step", step=3)
    [event] = read_json_lines(tmp_path / "a.jsonl")
    assert event["event"] == "first_step" and event["step"] == 3 and event["time"] > 0
    assert not (tmp_path / "b.jsonl").exists()


def test_unknown_framework_lists_valid_ones() -> None:
    with pytest.raises(UnknownFrameworkError, match="valid frameworks: chainer, tensorflow, torch"):
        get_workload("caffe")


def test_digest_is_order_independent_and_sensitive() -> None:
    import numpy as np

    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(2, dtype=np.float32)
    assert digest_arrays([("w", a), ("b", b)]) == digest_arrays([("b", b), ("w", a)])
    assert digest_arrays([("w", a)]) != digest_arrays([("w", a.reshape(3, 2))])
    changed = a.copy()
    changed[0, 0] = np.nextafter(changed[0, 0], np.float32(1))
    assert digest_arrays([("w", a)]) != digest_arrays([("w", changed)])
