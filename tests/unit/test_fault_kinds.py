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
from typing import Any, Callable, Iterator

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


# A warm process's generations, as experiments/warm/runner.py goes through them: it serves its rank
# of attempt 0, leaves it when told (the generation ended), and registers for attempt 1 if told "next".
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
    held = bytearray(128 << 20)  # the next generation's first step: it charges memory
    held[::4096] = b"\\x01" * len(range(0, 128 << 20, 4096))
registered.write_text("left")
while True:
    time.sleep(0.05)
"""


class WarmProcess:
    """One such process, rank ``rank`` of 2."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.trigger, self.registered = run_dir / f"go-{rank}", run_dir / f"registered-{rank}"
        env = {**os.environ, "FAULTDRILL_RUN_ID": RUN_ID, "SUBMITIT_LOCAL_JOB_ID": JOB_ID,
               "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_NTASKS": "2", "FAULTDRILL_WARM_WORLD": "2",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.proc = subprocess.Popen([sys.executable, "-c", WARM_PROCESS, str(run_dir), str(self.trigger),
                                      str(self.registered)], env=env)

    def wait_registered(self) -> None:
        wait_for(lambda: self.registered.exists(), 30, f"warm process {self.rank} to register")

    def leave(self, then: str = "next") -> None:
        """It leaves attempt 0 (and, with "next", serves attempt 1), as the generation ended."""
        self.trigger.write_text(then)
        wait_for(lambda: self.registered.read_text() == "left", 30, f"warm process {self.rank} to leave attempt 0")

    def alive_and_running(self) -> bool:
        return self.proc.poll() is None and _status(self.proc) != psutil.STATUS_STOPPED


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[list[WarmProcess]]:
    processes = [WarmProcess(tmp_path, rank) for rank in range(2)]
    for process in processes:
        process.wait_registered()
    yield processes
    for process in processes:
        process.proc.kill()
        process.proc.wait(timeout=10)


def _settled(process: WarmProcess) -> bool:
    """It runs on. Nothing to wait for here but the absence of an effect: a signal sent was
    delivered before its sender returned, and the beat covers the process acting on it."""
    time.sleep(0.3)
    return process.alive_and_running()


@pytest.mark.drill
@pytest.mark.parametrize("kind", ["kill-rank", "rank-error", "hang-rank", "stall-rank"])
def test_a_fault_aimed_at_an_attempt_a_warm_process_left_never_reaches_it(
        tmp_path: Path, warm: list[WarmProcess], kind: str) -> None:
    """Fired as the next generation formed: the process serves attempt 1 now (same pid, same start
    time as its identity of attempt 0). The fault came too late for attempt 0."""
    warm[0].leave()
    with pytest.raises(TargetRefused, match="left its attempt") as refused:
        get_kind(kind).act_on_node(_task(tmp_path, kind, (0,), signal="SIGKILL", deadline_s=2, duration_s=0.2))
    assert refused.value.gone
    assert _settled(warm[0])
    assert not RunPaths(tmp_path).fault_request_file(0, 0).exists()


def _during_the_wait(act: Callable[[float], None]) -> Callable[..., None]:
    """In place of a kind's wait for its moment (between verification and the act): ``act(moment)``."""
    return lambda task, targets, ending=None: act(task.not_before)


@pytest.mark.drill
def test_a_warm_process_that_leaves_after_its_verification_gets_no_signal(
        tmp_path: Path, warm: list[WarmProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """Verified in attempt 0, then the generation ended and the process left before the agreed
    moment (agents on several nodes wait up to two seconds): the signal is not sent."""
    import injectors.kinds.kill_rank as kill_rank
    monkeypatch.setattr(kill_rank, "wait_for_moment", _during_the_wait(lambda moment: warm[0].leave()))
    with pytest.raises(TargetRefused, match="ended after they were verified") as refused:
        get_kind("kill-rank").act_on_node(_task(tmp_path, "kill-rank", (0,), signal="SIGKILL"))
    assert refused.value.gone and _settled(warm[0])


@pytest.mark.drill
def test_a_request_reaches_the_ranks_still_in_the_attempt_and_not_the_one_that_left(
        tmp_path: Path, warm: list[WarmProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """rank-error on ranks 0 and 1; rank 1 left during the agreed wait: rank 0 raises, rank 1 is not
    asked (its request taken back), and the fault is what it did to rank 0 (not "gone" for all)."""
    import injectors.kinds.rank_error as rank_error
    monkeypatch.setattr(rank_error, "wait_for_moment", _during_the_wait(lambda moment: warm[1].leave()))
    outcome = get_kind("rank-error").act_on_node(_task(tmp_path, "rank-error", (0, 1), deadline_s=10))
    assert warm[0].proc.wait(timeout=10) == 1 and "raised InjectedRankError" in outcome.detail
    assert _settled(warm[1]) and not RunPaths(tmp_path).fault_request_file(0, 1).exists()


@pytest.mark.drill
def test_a_stall_lets_go_of_a_warm_process_that_left_just_before_its_stop(
        tmp_path: Path, warm: list[WarmProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its registration says it left (written just before the SIGSTOP landed): the SIGCONT still
    goes to the very process that was stopped, or it would stand still in its next attempt for ever."""
    import injectors.kinds.stall_rank as stall_rank
    identity = RunPaths(tmp_path).rank_file(0, 0)
    real_sleep = time.sleep

    def left_while_stopped(seconds: float) -> None:
        record = json.loads(identity.read_text())
        write_json_atomic(identity, {**record, "left_at": time.time()})
        real_sleep(seconds)

    monkeypatch.setattr(stall_rank.time, "sleep", left_while_stopped)
    outcome = get_kind("stall-rank").act_on_node(_task(tmp_path, "stall-rank", (0,), duration_s=0.2))
    assert "ended meanwhile" not in outcome.detail
    wait_for(warm[0].alive_and_running, 10, "the stalled process to go on")


@pytest.mark.drill
def test_oom_rank_caps_no_process_that_left_during_the_agreed_wait(
        tmp_path: Path, warm: list[WarmProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap came before the wait: the process that left ran its next attempt under this fault's
    cap, and the kernel killed it there."""
    from drills import memory_cgroup_writable
    if not memory_cgroup_writable():
        pytest.skip("no writable cgroup v1 memory controller here")
    import injectors.kinds.oom_rank as oom_rank
    monkeypatch.setattr(oom_rank, "wait_for_moment", _during_the_wait(lambda moment: warm[0].leave()))
    with pytest.raises(TargetRefused, match="left its attempt") as refused:
        get_kind("oom-rank").act_on_node(_task(tmp_path, "oom-rank", (0,), deadline_s=5))
    assert refused.value.gone and _settled(warm[0])
    own = Path(f"/proc/{warm[0].proc.pid}/cgroup").read_text()
    assert "faultdrill-oom" not in own, own


@pytest.mark.drill
def test_a_process_that_left_takes_no_request_of_the_attempt_it_left(tmp_path: Path, warm: list[WarmProcess]) -> None:
    """A request that reached it anyway (written and signalled before the agent read left_at): ignored."""
    from experiments.runtime.fault_requests import ACTION_RAISE, FAULT_SIGNAL
    warm[0].leave("wait")
    write_json_atomic(RunPaths(tmp_path).fault_request_file(0, 0), {"action": ACTION_RAISE})
    os.kill(warm[0].proc.pid, FAULT_SIGNAL)
    assert _settled(warm[0])


@pytest.mark.drill
def test_a_warm_process_still_in_its_attempt_is_hit(tmp_path: Path, warm: list[WarmProcess]) -> None:
    outcome = get_kind("kill-rank").act_on_node(_task(tmp_path, "kill-rank", (0,), signal="SIGKILL"))
    assert outcome.pid == warm[0].proc.pid and warm[0].proc.wait(timeout=10) == -9


@pytest.mark.drill
def test_a_stall_continues_only_the_processes_it_stopped(tmp_path: Path, warm: list[WarmProcess],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 left during the agreed wait, and something of its next attempt stopped it (a hang
    fault, a suspend): the stall of attempt 0 neither stopped it nor may continue it."""
    import signal

    import injectors.kinds.stall_rank as stall_rank

    def rank_1_leaves_and_is_stopped(moment: float) -> None:
        warm[1].leave()
        os.kill(warm[1].proc.pid, signal.SIGSTOP)

    monkeypatch.setattr(stall_rank, "wait_for_moment", _during_the_wait(rank_1_leaves_and_is_stopped))
    try:
        outcome = get_kind("stall-rank").act_on_node(_task(tmp_path, "stall-rank", (0, 1), duration_s=0.2))
        assert outcome.target.startswith("rank 0@"), outcome
        wait_for(warm[0].alive_and_running, 10, "rank 0 to go on")
        assert _status(warm[1].proc) == psutil.STATUS_STOPPED, "attempt 1's stop was undone"
    finally:
        os.kill(warm[1].proc.pid, signal.SIGCONT)


@pytest.mark.drill
def test_a_request_goes_on_when_a_target_ended_after_its_verification(
        tmp_path: Path, warm: list[WarmProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """rank-error on ranks 0 and 1; rank 1 died (and was reaped) during the agreed wait: rank 0 is
    still asked and the fault is what it did (the agent died of ProcessLookupError: 'refused')."""
    import injectors.kinds.rank_error as rank_error

    def rank_1_dies(moment: float) -> None:
        warm[1].proc.kill()
        warm[1].proc.wait(timeout=10)

    monkeypatch.setattr(rank_error, "wait_for_moment", _during_the_wait(rank_1_dies))
    outcome = get_kind("rank-error").act_on_node(_task(tmp_path, "rank-error", (0, 1), deadline_s=10))
    assert warm[0].proc.wait(timeout=10) == 1 and outcome.target.startswith("rank 0@"), outcome


@pytest.mark.drill
def test_oom_rank_takes_its_cap_off_a_target_it_did_not_ask(tmp_path: Path, warm: list[WarmProcess],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 left between its cap and the request: it is not asked, and its cap is gone before the
    fault waits for rank 0's end (not only once the fault is done, up to deadline_s later)."""
    from drills import memory_cgroup_writable
    if not memory_cgroup_writable():
        pytest.skip("no writable cgroup v1 memory controller here")
    import injectors.kinds.oom_rank as oom_rank
    real_cap, real_wait = oom_rank._cap, oom_rank.wait_for_ends
    seen: list[str] = []

    def cap_then_rank_1_leaves(task: FaultTask, target: Any, headroom: int) -> Any:
        cap = real_cap(task, target, headroom)
        if target.rank == 1:
            warm[1].leave("wait")
        return cap

    def wait_noting_rank_1s_cgroup(*args: Any) -> Any:
        seen.append(Path(f"/proc/{warm[1].proc.pid}/cgroup").read_text())
        return real_wait(*args)

    monkeypatch.setattr(oom_rank, "_cap", cap_then_rank_1_leaves)
    monkeypatch.setattr(oom_rank, "wait_for_ends", wait_noting_rank_1s_cgroup)
    outcome = get_kind("oom-rank").act_on_node(_task(tmp_path, "oom-rank", (0, 1), deadline_s=10))
    assert outcome.target.startswith("rank 0@") and "faultdrill-oom" not in seen[0], (outcome, seen)
    assert warm[0].proc.wait(timeout=10) == -9 and _settled(warm[1])


@pytest.mark.unit
def test_the_leak_holds_what_it_is_asked_within_bounds_and_a_bad_request_the_default() -> None:
    """Review of issue 22: oom-rank asks the rank to hold its job's limit plus headroom, up to most_mb
    (64 GiB) + headroom_mb (1 GiB); zero or less is no request (the default bound)."""
    from experiments.runtime.fault_requests import LEAK_LIMIT_BYTES, LEAK_MOST_BYTES, leak_bound

    assert leak_bound(700 << 20) == 700 << 20
    assert leak_bound((65536 + 1024) << 20) == LEAK_MOST_BYTES and leak_bound(1 << 50) == LEAK_MOST_BYTES
    assert leak_bound(0) == leak_bound(-5) == leak_bound(None) == LEAK_LIMIT_BYTES


@pytest.mark.unit
def test_a_rank_whose_memory_cgroup_cannot_be_read_is_refused_with_the_reason(tmp_path, monkeypatch) -> None:
    """Review of issue 22: /proc mounted hidepid (or a cgroup file not readable) is a refusal that
    says so, not a traceback."""
    from injectors.kinds import oom_rank
    from injectors.kinds.base import FaultTask
    from injectors.targets import TargetRefused, VerifiedTarget

    def unreadable(pid: int) -> None:
        raise PermissionError(13, "Permission denied", f"/proc/{pid}/cgroup")

    monkeypatch.setattr(oom_rank, "verify_all", lambda task: [VerifiedTarget(4242, 0, "n", "1")])
    monkeypatch.setattr(oom_rank, "job_memory_limit", unreadable)
    task = FaultTask(kind="oom-rank", run_dir=tmp_path, run_id="r", attempt=0, job_id="1", ranks=(0,))
    with pytest.raises(TargetRefused, match="cannot be read here .Permission denied: /proc/4242/cgroup"):
        oom_rank.OomRank().act_on_node(task)
