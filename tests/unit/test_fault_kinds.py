"""The fault kinds acting on real processes and files on this machine (issue 8): what each does to
its verified targets, several ranks at one instant, and what each refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from experiments.layout import RankIdentity, RunPaths, write_json_atomic
from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore
from experiments.runtime.identity import start_ticks
from injectors.kinds import REGISTRY, get_kind
from injectors.kinds.base import FaultTask, Site
from injectors.targets import TargetRefused
from rank_launch import wait_for

RUN_ID, JOB_ID = "r000", "5151"


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two registered 'rank' processes of attempt 0 that tick a file while they run."""
    procs = []
    for rank in range(2):
        env = {**os.environ, "FAULTDRILL_RUN_ID": RUN_ID, "SUBMITIT_LOCAL_JOB_ID": JOB_ID,
               "SUBMITIT_LOCAL_GLOBALID": str(rank)}
        tick = tmp_path / f"tick-{rank}"
        code = f"import time\nwhile True:\n    open({str(tick)!r}, 'a').write('.')\n    time.sleep(0.02)\n"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        identity = RankIdentity(rank=rank, pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(),
                                host="h", node="n", job_id=JOB_ID, attempt=0, start_ticks=start_ticks(proc.pid) or 0)
        write_json_atomic(RunPaths(tmp_path).rank_file(0, rank), asdict(identity))
        procs.append(proc)
    wait_for(lambda: all((tmp_path / f"tick-{rank}").exists() for rank in range(2)), 30, "the ranks to tick")
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _task(tmp_path: Path, kind: str, ranks: tuple[int, ...] = (), **options: object) -> FaultTask:
    return FaultTask(kind=kind, run_dir=tmp_path, run_id=RUN_ID, attempt=0, job_id=JOB_ID, ranks=ranks,
                     options=dict(options))


def _status(proc: subprocess.Popen[bytes]) -> str:
    return psutil.Process(proc.pid).status()


@pytest.mark.drill
def test_kill_rank_hits_several_ranks_at_one_instant(tmp_path: Path, ranks: list[subprocess.Popen[bytes]]) -> None:
    moment = time.time() + 0.3
    task = FaultTask(**{**_task(tmp_path, "kill-rank", (0, 1), signal="SIGKILL").__dict__, "not_before": moment})
    outcome = get_kind("kill-rank").act_on_node(task)
    assert outcome.target == "ranks 0,1@n" and outcome.at >= moment
    assert [proc.wait(timeout=10) for proc in ranks] == [-9, -9]


@pytest.mark.drill
def test_hang_rank_stops_the_rank_and_leaves_it_stopped(tmp_path: Path, ranks: list[subprocess.Popen[bytes]]) -> None:
    outcome = get_kind("hang-rank").act_on_node(_task(tmp_path, "hang-rank", (1,)))
    assert outcome.signal == "SIGSTOP" and outcome.pid == ranks[1].pid
    wait_for(lambda: _status(ranks[1]) == psutil.STATUS_STOPPED, 10, "the rank to stop")
    assert _status(ranks[0]) != psutil.STATUS_STOPPED


@pytest.mark.drill
def test_stall_rank_stops_the_rank_for_its_duration_then_lets_it_go_on(tmp_path: Path,
                                                                        ranks: list[subprocess.Popen[bytes]]) -> None:
    tick = tmp_path / "tick-0"
    started = time.monotonic()
    outcome = get_kind("stall-rank").act_on_node(_task(tmp_path, "stall-rank", (0,), duration_s=0.6))
    assert time.monotonic() - started >= 0.6 and "stopped for 0.6" in outcome.detail
    assert _status(ranks[0]) != psutil.STATUS_STOPPED
    before = tick.stat().st_size
    deadline = time.monotonic() + 10
    while tick.stat().st_size == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tick.stat().st_size > before, "the rank did not go on after its stall"


@pytest.mark.drill
def test_rank_kinds_refuse_what_is_not_the_drills(tmp_path: Path, ranks: list[subprocess.Popen[bytes]]) -> None:
    for kind in ("kill-rank", "hang-rank", "stall-rank"):
        task = FaultTask(**{**_task(tmp_path, kind, (1,), signal="SIGKILL", duration_s=1).__dict__, "job_id": "1"})
        with pytest.raises(TargetRefused):
            get_kind(kind).act_on_node(task)
    assert all(proc.poll() is None and _status(proc) != psutil.STATUS_STOPPED for proc in ranks)


def _checkpoints(tmp_path: Path, steps: tuple[int, ...]) -> CheckpointStore:
    store = CheckpointStore(tmp_path)
    for step in steps:
        sink = store.sink(step)
        sink.write_bytes("model.bin", bytes(range(256)) * 40)
        sink.write_bytes("rng.bin", b"r" * 10)
        sink.close()
        store.commit(step, 0, CheckpointMeta("t", "raw", "all"), time.monotonic(), 0.0)
    return store


NO_JOB: Any = None  # corrupt-checkpoint acts on files only: it never touches the job


@pytest.mark.parametrize("mode", ["flip", "truncate", "delete"])
def test_corrupt_checkpoint_damages_the_newest_and_the_resume_falls_back(tmp_path: Path, mode: str) -> None:
    store = _checkpoints(tmp_path, (10, 20))
    before = (store.step_dir(20) / "model.bin").read_bytes()
    outcome = get_kind("corrupt-checkpoint").act_on_controller(_task(tmp_path, "corrupt-checkpoint", mode=mode,
                                                                     step="newest"), NO_JOB)
    assert outcome.target == "checkpoint step-00000020/model.bin" and outcome.detail == mode
    damaged = store.step_dir(20) / "model.bin"
    if mode == "delete":
        assert not damaged.exists()
    else:
        assert damaged.read_bytes() != before
        assert (len(damaged.read_bytes()) == len(before)) == (mode == "flip")  # flip: only the hash tells
    found = store.newest_valid()
    assert found is not None and found.step == 10


def test_corrupt_checkpoint_refuses_without_a_published_checkpoint_or_outside_the_run(tmp_path: Path) -> None:
    kind = get_kind("corrupt-checkpoint")
    with pytest.raises(TargetRefused, match="no published checkpoint"):
        kind.act_on_controller(_task(tmp_path, "corrupt-checkpoint", mode="flip", step="newest"), NO_JOB)
    _checkpoints(tmp_path, (10,))
    with pytest.raises(TargetRefused, match="not a published checkpoint"):
        kind.act_on_controller(_task(tmp_path, "corrupt-checkpoint", mode="flip", step=30), NO_JOB)
    with pytest.raises(TargetRefused, match="no file 'passwd'"):
        kind.act_on_controller(_task(tmp_path, "corrupt-checkpoint", mode="delete", step=10, file="passwd"), NO_JOB)


def test_every_kind_in_the_registry_says_what_it_targets_and_where_it_acts() -> None:
    for name in REGISTRY:
        kind = get_kind(name)
        assert kind.name == name and kind.options.model_fields["kind"].default == name
        assert kind.site in (Site.NODE, Site.CONTROLLER) and kind.describe((1,), {})
    assert json.dumps(_task(Path("/w"), "kill-rank", (1,), signal="SIGKILL").to_json_dict())


def test_a_target_that_ended_after_its_verification_is_gone_not_a_crash() -> None:
    """In-allocation on PBS: the agent verifies a hung rank, then the batch script ends the launch on
    the controller's go; the SIGKILL finds no process. The agent must say "gone", not die of it."""
    from injectors.kinds.signals import send
    from injectors.targets import TargetRefused, VerifiedTarget

    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    unused = next(pid for pid in range(pid_max - 1, 1, -1) if not Path(f"/proc/{pid}").exists())
    ended = VerifiedTarget(pid=unused, rank=3, node="n1", job_id="7")
    with pytest.raises(TargetRefused, match=r"rank\(s\) 3 ended after they were verified") as refused:
        send([ended], "SIGKILL")
    assert refused.value.gone
    assert send([], "SIGCONT") > 0  # nothing to signal (a stall whose ranks all ended): no error


# A warm process's generations, as experiments/warm/runner.py goes through them: it serves rank 0
# of attempt 0, leaves it when told (the generation ended), and registers as rank 0 of attempt 1.
WARM_PROCESS = """
import os, socket, sys, time
from pathlib import Path
from experiments.layout import RunPaths
from experiments.runtime.distenv import DistEnv
from experiments.runtime.identity import leave_attempt, register_rank
run_dir, trigger, registered = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
paths = RunPaths(run_dir)
env = DistEnv.from_environ()
register_rank(paths, env, 0)
registered.write_text("0")
while not trigger.exists():
    time.sleep(0.01)
leave_attempt(paths, env.rank, 0)
if trigger.read_text() == "next":
    register_rank(paths, env, 1)
registered.write_text("left")
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def warm_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    env = {**os.environ, "FAULTDRILL_RUN_ID": RUN_ID, "SUBMITIT_LOCAL_JOB_ID": JOB_ID, "SUBMITIT_LOCAL_GLOBALID": "0",
           "SUBMITIT_LOCAL_NTASKS": "1", "FAULTDRILL_WARM_WORLD": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    registered = tmp_path / "registered"
    proc = subprocess.Popen([sys.executable, "-c", WARM_PROCESS, str(tmp_path), str(tmp_path / "go"), str(registered)],
                            env=env)
    wait_for(lambda: registered.exists(), 30, "the warm process to register")
    yield proc, registered
    proc.kill()
    proc.wait(timeout=10)


def _leave(tmp_path: Path, registered: Path, then: str) -> None:
    (tmp_path / "go").write_text(then)
    wait_for(lambda: registered.read_text() == "left", 30, "the warm process to leave attempt 0")


@pytest.mark.drill
@pytest.mark.parametrize("kind", ["kill-rank", "rank-error", "hang-rank"])
def test_a_fault_aimed_at_an_attempt_a_warm_process_left_never_reaches_it(
        tmp_path: Path, warm_process: tuple[subprocess.Popen[bytes], Path], kind: str) -> None:
    """Fired as the next generation formed: the process serves attempt 1 now (same pid, same start
    time as its identity of attempt 0). The fault came too late for attempt 0."""
    proc, registered = warm_process
    _leave(tmp_path, registered, "next")
    with pytest.raises(TargetRefused, match="left its attempt") as refused:
        get_kind(kind).act_on_node(_task(tmp_path, kind, (0,), signal="SIGKILL", deadline_s=2))
    assert refused.value.gone
    time.sleep(0.3)  # a signal sent would have landed by now
    assert proc.poll() is None and _status(proc) != psutil.STATUS_STOPPED
    assert not RunPaths(tmp_path).fault_request_file(0, 0).exists()


@pytest.mark.drill
def test_a_warm_process_that_leaves_after_its_verification_gets_no_signal(
        tmp_path: Path, warm_process: tuple[subprocess.Popen[bytes], Path]) -> None:
    """Verified in attempt 0, then the generation ended and the process left before the agreed
    moment (agents on several nodes wait up to two seconds): the signal is not sent."""
    from injectors.kinds.signals import send, verify_all
    proc, registered = warm_process
    targets = verify_all(_task(tmp_path, "kill-rank", (0,)))
    _leave(tmp_path, registered, "wait")
    with pytest.raises(TargetRefused, match="ended after they were verified") as refused:
        send(targets, "SIGKILL")
    assert refused.value.gone
    time.sleep(0.3)
    assert proc.poll() is None


@pytest.mark.drill
def test_a_warm_process_still_in_its_attempt_is_hit(tmp_path: Path,
                                                    warm_process: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, _ = warm_process
    outcome = get_kind("kill-rank").act_on_node(_task(tmp_path, "kill-rank", (0,), signal="SIGKILL"))
    assert outcome.pid == proc.pid and proc.wait(timeout=10) == -9
