"""The oom-rank fault's parts on this machine's kernel: a memory cgroup that caps one process, the
rank runtime's leak on request, and the kernel's OOM killer ending the process (counted by the
cgroup); a process that does not grow is left as it was, its cgroup removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.runtime.fault_requests import ACTION_LEAK, FAULT_SIGNAL
from injectors.memory_cgroup import MemoryCap, own_memory_cgroup
from injectors.targets import TargetRefused

LEAKER = ("import sys, time; from pathlib import Path; from experiments.runtime.fault_requests import FaultRequests; "
          "FaultRequests(Path(sys.argv[1])).install(); print('ready', flush=True); time.sleep(60)")


def _cgroup_v1_memory() -> bool:
    try:
        return os.geteuid() == 0 and os.access(own_memory_cgroup(os.getpid()), os.W_OK)
    except (TargetRefused, OSError):
        return False


pytestmark = pytest.mark.skipif(not _cgroup_v1_memory(), reason="needs root and a writable cgroup v1 memory controller")


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
