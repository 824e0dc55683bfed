"""The oom-rank fault's parts on this machine's kernel: a memory cgroup that caps one process, the
rank runtime's leak on request, and the kernel's OOM killer ending the process (counted by the
cgroup); a process that does not grow is left as it was, its cgroup removed. Under a job's memory
limit (a cgroup the test makes, as Slurm's task/cgroup makes one per job) the fault makes no
cgroup: the rank outgrows the job's. On Slurm's own: tests/cluster/test_site_profiles.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drills import memory_cgroup_writable
from experiments.runtime.fault_requests import ACTION_LEAK, FAULT_SIGNAL
from injectors.memory_cgroup import MemoryCap, own_memory_cgroup
from injectors.targets import TargetRefused

LEAKER = ("import sys, time; from pathlib import Path; from experiments.runtime.fault_requests import FaultRequests; "
          "FaultRequests(Path(sys.argv[1])).install(); print('ready', flush=True); time.sleep(60)")


pytestmark = pytest.mark.skipif(not memory_cgroup_writable(), reason="needs root and a writable cgroup v1 memory controller")


def _start(code: str, request_file: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code, str(request_file)], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2])
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_a_capped_leak_is_ended_by_the_kernels_oom_killer_and_counted(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"action": ACTION_LEAK}))
    process = _start(LEAKER, request)
    cap = MemoryCap.create(process.pid, f"faultdrill-oom-test-{process.pid}", 32 << 20)
    try:
        assert str(process.pid) in (cap.directory / "cgroup.procs").read_text().split()
        os.kill(process.pid, FAULT_SIGNAL)
        assert process.wait(timeout=30) == -9, "the OOM killer did not end the leaking process"
        assert cap.oom_kills() == 1 and cap.peak_bytes() <= 32 << 20
    finally:
        process.kill()
        process.wait()
        cap.remove()
    assert not cap.directory.exists()


def test_a_process_that_does_not_grow_goes_back_unharmed(tmp_path: Path) -> None:
    process = _start("import time; print('ready', flush=True); time.sleep(60)", tmp_path / "none")  # no handler
    parent = own_memory_cgroup(process.pid)
    cap = MemoryCap.create(process.pid, f"faultdrill-oom-test-{process.pid}", 32 << 20)
    try:
        os.kill(process.pid, FAULT_SIGNAL)  # ignored by default
        assert process.poll() is None and cap.oom_kills() == 0
        cap.remove()
        assert not cap.directory.exists() and own_memory_cgroup(process.pid) == parent
    finally:
        process.kill()
        process.wait()
        cap.remove()


def test_a_target_that_ends_before_its_cap_leaves_no_other_rank_capped(tmp_path: Path, monkeypatch) -> None:
    """Issue 21, item 18: two ranks verified; the second ends before its cap is made. The fault is
    refused as gone (no traceback, a verdict) and the first rank's cap is removed again."""
    from injectors.kinds import oom_rank
    from injectors.kinds.base import FaultTask
    from injectors.targets import VerifiedTarget

    live = _start("import time; print('ready', flush=True); time.sleep(60)", tmp_path / "none")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: its pid names no process now
    parent = own_memory_cgroup(live.pid)
    targets = [VerifiedTarget(live.pid, 0, "n", "1"), VerifiedTarget(ended.pid, 1, "n", "1")]
    monkeypatch.setattr(oom_rank, "verify_all", lambda task: targets)
    task = FaultTask(kind="oom-rank", run_dir=tmp_path, run_id="r", attempt=0, job_id="1", ranks=(0, 1),
                     options={"limit": "agent"})
    try:
        with pytest.raises(TargetRefused) as refused:
            oom_rank.OomRank().act_on_node(task)
        assert refused.value.gone, refused.value
        assert own_memory_cgroup(live.pid) == parent, "the first rank was left under its cap"
        assert not list(parent.glob(f"faultdrill-oom-r-*-{live.pid}")), "a cap was left behind"
    finally:
        live.kill()
        live.wait()


def _rank_under_a_job_limit(tmp_path: Path, limit_bytes: int) -> tuple[subprocess.Popen[str], MemoryCap]:
    """A rank (the rank runtime's request handler) in a cgroup limited as a scheduler limits its job."""
    from experiments.layout import RunPaths
    request = RunPaths(tmp_path).fault_request_file(0, 0)
    request.parent.mkdir(parents=True, exist_ok=True)
    process = _start(LEAKER, request)
    return process, MemoryCap.create(process.pid, f"faultdrill-joblimit-test-{process.pid}", limit_bytes)


def test_a_rank_under_its_jobs_memory_limit_is_made_to_outgrow_it_and_no_cgroup_is_made(
        tmp_path: Path, monkeypatch) -> None:
    """Issue 22 item 4: the job's limit read (any user may), the rank asked to grow past the room it
    leaves, the kernel's OOM killer ends it at that limit; the fault made no cgroup of its own."""
    from injectors.kinds import oom_rank
    from injectors.kinds.base import FaultTask
    from injectors.targets import VerifiedTarget

    process, job = _rank_under_a_job_limit(tmp_path, 96 << 20)
    monkeypatch.setattr(oom_rank, "verify_all", lambda task: [VerifiedTarget(process.pid, 0, "n", "1")])
    task = FaultTask(kind="oom-rank", run_dir=tmp_path, run_id="r", attempt=0, job_id="1", ranks=(0,),
                     options={"limit": "job", "deadline_s": 20})
    try:
        outcome = oom_rank.OomRank().act_on_node(task)
        assert process.wait(timeout=30) == -9, "the OOM killer did not end the rank"
        assert outcome.detail.startswith("the job's memory limit (96 MB"), outcome.detail
        assert "the kernel's OOM killer ended it" in outcome.detail
        assert not list(job.directory.glob("faultdrill-oom-*")), "the agent made a cgroup of its own"
    finally:
        process.kill()
        process.wait()
        job.remove()


def test_limit_job_where_no_cgroup_limits_the_rank_is_refused_and_the_rank_left_alone(
        tmp_path: Path, monkeypatch) -> None:
    from injectors.kinds import oom_rank
    from injectors.kinds.base import FaultTask
    from injectors.targets import VerifiedTarget

    process = _start("import time; print('ready', flush=True); time.sleep(60)", tmp_path / "none")
    monkeypatch.setattr(oom_rank, "verify_all", lambda task: [VerifiedTarget(process.pid, 0, "n", "1")])
    task = FaultTask(kind="oom-rank", run_dir=tmp_path, run_id="r", attempt=0, job_id="1", ranks=(0,),
                     options={"limit": "job"})
    try:
        with pytest.raises(TargetRefused, match="job has no memory limit"):
            oom_rank.OomRank().act_on_node(task)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


HIGH_WATER = ("import sys, time\n"
              "print('ready', flush=True)\n"
              "sys.stdin.readline()\n"
              "block = bytearray(int(sys.argv[1])); block[::4096] = b'x' * len(range(0, len(block), 4096)); del block\n"
              "print('peaked', flush=True)\n"
              "time.sleep(60)\n")


def test_a_rank_that_ends_otherwise_under_a_job_limit_already_peaked_is_not_taken_for_an_oom_kill(
        tmp_path: Path, monkeypatch) -> None:
    """Review of issue 22: the job's cgroup's peak is a high-water mark. Once something reached the
    limit earlier (an earlier attempt in the job, a big allocation), a rank that then ends of
    something else must not be recorded as the OOM killer's (refused: not known)."""
    import signal
    import threading

    from injectors.kinds import oom_rank
    from injectors.kinds.base import FaultTask
    from injectors.targets import VerifiedTarget

    limit = 64 << 20
    process = subprocess.Popen([sys.executable, "-c", HIGH_WATER, str(61 << 20)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline().strip() == "ready"
    job = MemoryCap.create(process.pid, f"faultdrill-joblimit-test-{process.pid}", limit)
    try:
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "peaked" and job.peak_bytes() >= limit - (4 << 20)
        monkeypatch.setattr(oom_rank, "verify_all", lambda task: [VerifiedTarget(process.pid, 0, "n", "1")])
        threading.Timer(0.5, lambda: os.kill(process.pid, signal.SIGKILL)).start()  # ended by something else
        task = FaultTask(kind="oom-rank", run_dir=tmp_path, run_id="r", attempt=0, job_id="1", ranks=(0,),
                         options={"limit": "job", "deadline_s": 5})
        with pytest.raises(TargetRefused, match="whether the OOM killer ended it is not known"):
            oom_rank.OomRank().act_on_node(task)
    finally:
        process.kill()
        process.wait()
        job.remove()
