"""The injector acts only on processes it verified as the drill's own, and says why it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from experiments.layout import RankIdentity, RunPaths, write_json_atomic
from experiments.runtime.identity import start_ticks
from injectors.kinds import get_kind
from injectors.kinds.base import FaultOutcome, FaultTask
from injectors.targets import TargetRefused, verify_rank

RUN_ID = "r000"
JOB_ID = "4242"


@pytest.fixture
def rank_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "FAULTDRILL_RUN_ID": RUN_ID, "SUBMITIT_LOCAL_JOB_ID": JOB_ID, "SUBMITIT_LOCAL_GLOBALID": "1"}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def kill_rank(run_dir: Path, run_id: str, attempt: int, rank: int, job_id: str, signal: str) -> FaultOutcome:
    task = FaultTask(kind="kill-rank", run_dir=run_dir, run_id=run_id, attempt=attempt, job_id=job_id,
                     ranks=(rank,), options={"signal": signal})
    return get_kind("kill-rank").act_on_node(task)


def _register(run_dir: Path, pid: int, job_id: str = JOB_ID, clock_shift_s: float = 0.0, ticks_shift: int = 0) -> None:
    identity = RankIdentity(rank=1, pid=pid, create_time=psutil.Process(pid).create_time() + clock_shift_s,
                            host="h", node="n", job_id=job_id, attempt=0,
                            start_ticks=(start_ticks(pid) or 0) + ticks_shift)
    write_json_atomic(RunPaths(run_dir).rank_file(0, 1), asdict(identity))


def test_verified_rank_is_killed(tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    _register(tmp_path, rank_process.pid)
    outcome = kill_rank(tmp_path, RUN_ID, 0, 1, JOB_ID, "SIGKILL")
    assert outcome.pid == rank_process.pid and outcome.signal == "SIGKILL"
    assert rank_process.wait(timeout=10) == -9
    assert abs(outcome.at - time.time()) < 10


def test_refuses_unregistered_rank(tmp_path: Path) -> None:
    with pytest.raises(TargetRefused, match="has not registered"):
        verify_rank(tmp_path, RUN_ID, 0, 1, JOB_ID)


def test_refuses_other_run(tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    _register(tmp_path, rank_process.pid)
    with pytest.raises(TargetRefused, match="FAULTDRILL_RUN_ID"):
        verify_rank(tmp_path, "someone-else", 0, 1, JOB_ID)
    assert rank_process.poll() is None


def test_refuses_other_job(tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    _register(tmp_path, rank_process.pid, job_id="999")
    with pytest.raises(TargetRefused, match="registered job 999"):
        verify_rank(tmp_path, RUN_ID, 0, 1, "999" + "0")
    _register(tmp_path, rank_process.pid, job_id="999")
    with pytest.raises(TargetRefused, match="job id in its environment"):
        verify_rank(tmp_path, RUN_ID, 0, 1, "999")


def test_refuses_reused_pid(tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    _register(tmp_path, rank_process.pid, ticks_shift=-100)
    with pytest.raises(TargetRefused, match="reused"):
        verify_rank(tmp_path, RUN_ID, 0, 1, JOB_ID)
    assert rank_process.poll() is None


def test_a_wall_clock_step_since_the_rank_started_does_not_make_it_a_stranger(
        tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    """psutil's create_time is the boot time *as the clock says now* plus the kernel's start ticks: a
    rank and an agent that read it across an NTP step (a fresh machine) disagree by seconds. The
    check uses the ticks, which never change."""
    _register(tmp_path, rank_process.pid, clock_shift_s=1.5)
    assert verify_rank(tmp_path, RUN_ID, 0, 1, JOB_ID).pid == rank_process.pid


def test_refuses_process_without_drill_environment(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _register(tmp_path, stranger.pid)
        with pytest.raises(TargetRefused):
            kill_rank(tmp_path, RUN_ID, 0, 1, JOB_ID, "SIGKILL")
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


def _agent(tmp_path: Path, job_id: str) -> list[str]:
    task = FaultTask(kind="kill-rank", run_dir=tmp_path, run_id=RUN_ID, attempt=0, job_id=job_id, ranks=(1,),
                     options={"signal": "SIGTERM"})
    return [sys.executable, "-m", "injectors.agent", "kill-rank", "--task", json.dumps(task.to_json_dict()),
            "--record", str(tmp_path / "verdict.json")]


def test_agent_cli_reports_verdicts(tmp_path: Path, rank_process: subprocess.Popen[bytes]) -> None:
    _register(tmp_path, rank_process.pid)
    refused = subprocess.run(_agent(tmp_path, "1"), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3 and json.loads(refused.stdout)["ok"] is False
    assert rank_process.poll() is None
    done = subprocess.run(_agent(tmp_path, JOB_ID), capture_output=True, text=True, timeout=60)
    verdict = json.loads(done.stdout)
    assert done.returncode == 0 and verdict["ok"] and verdict["pid"] == rank_process.pid
    assert json.loads((tmp_path / "verdict.json").read_text()) == verdict
    assert rank_process.wait(timeout=10) == -15


def test_a_rank_whose_environment_is_already_released_is_gone(tmp_path: Path) -> None:
    """An exiting process reads an empty /proc/PID/environ (its memory is released before it is a
    zombie): that is a rank already ending (its launcher ended it), not a refusal that would make a
    hung attempt's in-allocation relaunch cancel the whole job. Emulated by a process given no
    environment: it is left alone either way."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
    try:
        _register(tmp_path, process.pid)
        with pytest.raises(TargetRefused, match="no longer running") as refused:
            verify_rank(tmp_path, RUN_ID, 0, 1, JOB_ID)
        assert refused.value.gone and process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=10)


# In a pid namespace of its own (so that forcing the next pid touches nothing else): rank A is
# verified, dies and is reaped; B is started with A's pid (ns_last_pid); the kill must not reach B.
PID_REUSE = r"""
import os, signal, subprocess, sys, time
from dataclasses import asdict
from pathlib import Path
import psutil
from experiments.layout import RankIdentity, RunPaths, write_json_atomic
from experiments.runtime.identity import start_ticks
from injectors.kinds.signals import send
from injectors.targets import TargetRefused, verify_rank

run_dir = Path(sys.argv[1])
env = {**os.environ, "FAULTDRILL_RUN_ID": "r000", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_GLOBALID": "1"}
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
time.sleep(0.5)
write_json_atomic(RunPaths(run_dir).rank_file(0, 1), asdict(RankIdentity(
    rank=1, pid=rank.pid, create_time=psutil.Process(rank.pid).create_time(), host="h", node="n", job_id="4242",
    attempt=0, start_ticks=start_ticks(rank.pid) or 0)))
target = verify_rank(run_dir, "r000", 0, 1, "4242")
rank.kill(); rank.wait()
Path("/proc/sys/kernel/ns_last_pid").write_text(str(rank.pid - 1))
stranger = subprocess.Popen(["sleep", "60"])
assert stranger.pid == rank.pid, (stranger.pid, rank.pid)
try:
    send([target], "SIGKILL")
    print("signalled")
except TargetRefused as refused:
    print("gone" if refused.gone else f"refused: {refused}")
time.sleep(0.2)
print("stranger alive" if stranger.poll() is None else f"stranger ended {stranger.returncode}")
stranger.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace and ns_last_pid need root")
def test_a_pid_reused_between_verification_and_signal_is_not_signalled(tmp_path: Path) -> None:
    """Security issue 28, item 6: the agent verified a rank, waited (up to 2 s for its peers on other
    nodes), then signalled the pid, which another process may have by then."""
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID_REUSE, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["gone", "stranger alive"], done.stdout


SUPERVISOR = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env={'PATH': '/usr/bin'},"
              " process_group=0)\n"
              "print(child.pid, flush=True)\n"
              "child.wait()\n")


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A supervisor with the drill's variables and its child, the rank, leading a group of its own
    with none of them (as behind a container starter)."""
    env = {**os.environ, "FAULTDRILL_RUN_ID": RUN_ID, "SUBMITIT_LOCAL_JOB_ID": JOB_ID, "SUBMITIT_LOCAL_GLOBALID": "1"}
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], env=env, stdout=subprocess.PIPE, text=True)
    assert supervisor.stdout is not None
    child = int(supervisor.stdout.readline())
    yield supervisor, child
    for pid in (child, supervisor.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    supervisor.wait(timeout=10)


def _unreadable_environment(monkeypatch: pytest.MonkeyPatch, pid: int) -> None:
    """``pid``'s environment as a setuid starter's is to its user: not readable (AccessDenied)."""
    readable = psutil.Process.environ

    def environ(process: psutil.Process) -> dict[str, str]:
        if process.pid == pid:
            raise psutil.AccessDenied(pid)
        return readable(process)

    monkeypatch.setattr(psutil.Process, "environ", environ)


def _register_supervised(run_dir: Path, child: int, supervisor: int) -> None:
    identity = RankIdentity(rank=1, pid=child, create_time=psutil.Process(child).create_time(), host="h", node="n",
                            job_id=JOB_ID, attempt=0, start_ticks=start_ticks(child) or 0, group=True,
                            supervisor_pid=supervisor, supervisor_start_ticks=start_ticks(supervisor))
    write_json_atomic(RunPaths(run_dir).rank_file(0, 1), asdict(identity))


def test_a_rank_whose_environment_cannot_be_read_is_verified_as_its_supervisors_child_and_its_group_hit(
        tmp_path: Path, supervised: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 item 7: apptainer's setuid starter hides its environment from its own user. The rank
    the supervisor registered is its child (pid and start time); the supervisor's environment names
    the drill's run, job and rank: the kill reaches the rank's whole group."""
    supervisor, child = supervised
    _unreadable_environment(monkeypatch, child)
    _register_supervised(tmp_path, child, supervisor.pid)
    outcome = kill_rank(tmp_path, RUN_ID, 0, 1, JOB_ID, "SIGKILL")
    assert outcome.pid == child
    assert supervisor.wait(timeout=10) == 0, "the supervisor saw its child end (killed)"


def test_a_rank_whose_environment_cannot_be_read_and_whose_parent_is_not_its_supervisor_is_refused(
        tmp_path: Path, supervised: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch) -> None:
    _, child = supervised
    _unreadable_environment(monkeypatch, child)
    _register_supervised(tmp_path, child, os.getpid())  # a claim naming another process as its supervisor
    with pytest.raises(TargetRefused, match="not the child of the supervisor"):
        verify_rank(tmp_path, RUN_ID, 0, 1, JOB_ID)
    assert psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
