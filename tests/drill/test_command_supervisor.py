"""The supervisor of a command workload's rank, as a real process (python -m experiments.entry):
the script gets its arguments verbatim, is the rank the injector sees, and the rank ends as the
script ended; zero-code progress comes from its log lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from experiments.layout import (
    ENV_JOB_ID,
    PROGRESS_CHECKPOINTS,
    PROGRESS_LOG,
    CommandSpec,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
    rank_job_to_dict,
    read_json_lines,
)
from orchestrator.campaign.failure_classes import FailureClass, FailureEvidence, classify
from orchestrator.states import JobState

HOSTILE = ["a b", "it's \"quoted\"", "$HOME", "`id`", "; rm -rf /", "*"]


def _run(tmp_path: Path, argv: list[str], steps: int = 1, progress: str = PROGRESS_LOG,
         env: dict[str, str] | None = None, attempt: int = 0) -> tuple[subprocess.CompletedProcess, RunPaths]:
    run_dir = tmp_path / "run"
    command = CommandSpec(argv=tuple(argv), env=tuple((env or {}).items()), cwd=str(tmp_path), progress=progress,
                          step_regex=r"^step (\d+)", checkpoint_glob="own/ckpt-*.pt",
                          checkpoint_step_regex=r"ckpt-(\d+)")
    job = RankJob(run_id="r", run_dir=str(run_dir), attempt=attempt, checkpoint_every=0, checkpoint_keep=2,
                  workload=WorkloadSpec(framework="other", steps=steps, command=command))
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(rank_job_to_dict(job)))
    done = subprocess.run([sys.executable, "-m", "experiments.entry", "--job", str(job_file)], capture_output=True,
                          text=True, timeout=120)
    return done, RunPaths(run_dir)


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_the_script_gets_its_arguments_verbatim_and_the_drills_variables(tmp_path: Path) -> None:
    body = ("import json, os, sys; print('step 1', flush=True); "
            "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k.startswith(('FAULTDRILL_', 'RANK', 'WORLD', 'MASTER', 'MINE', 'PYTHONUNBUFFERED'))}}, "
            "open('seen.json', 'w'))")
    done, paths = _run(tmp_path, [*_script(body), *HOSTILE], env={"MINE": "$HOME"})
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == HOSTILE
    env = seen["env"]
    assert env["MINE"] == "$HOME" and env["RANK"] == env["FAULTDRILL_RANK"] == "0" and env["WORLD_SIZE"] == "1"
    assert env["FAULTDRILL_CHECKPOINT_DIR"] == str(paths.checkpoints) and env["FAULTDRILL_ATTEMPT"] == "0"
    assert env["FAULTDRILL_RUN_DIR"] == str(paths.root) and env["FAULTDRILL_RUN_ID"] == "r"
    assert json.loads(env["FAULTDRILL_RANK_JOB"])["run_dir"] == str(paths.root)
    assert json.loads(paths.final.read_text())["step"] == 1
    # Issue 27, item 4: a Python script's step lines reach the supervisor as they are printed, not in
    # 8 KB blocks (a step-anchored kill landed 4-94 steps late).
    assert env["PYTHONUNBUFFERED"] == "1"


def test_the_script_is_the_rank_and_the_rank_dies_of_its_signal(tmp_path: Path) -> None:
    body = "import json, os, signal; json.dump(os.getpid(), open('pid.json', 'w')); os.kill(os.getpid(), signal.SIGKILL)"
    done, paths = _run(tmp_path, _script(body))
    assert done.returncode == -signal.SIGKILL
    identity = json.loads(paths.rank_file(0, 0).read_text())
    assert identity["pid"] == json.loads((tmp_path / "pid.json").read_text())  # the child, not the supervisor
    assert identity["start_ticks"] > 0


def test_an_exit_code_is_passed_on_with_the_scripts_last_words(tmp_path: Path) -> None:
    done, paths = _run(tmp_path, _script("import sys; sys.exit('cuda is not here')"))
    assert done.returncode == 1
    error = json.loads(paths.rank_error_file(0, 0).read_text())["error"]
    assert "exited with code 1: cuda is not here" in error


@pytest.mark.parametrize("code", [3, 75, 137])
def test_the_rank_exits_with_the_scripts_own_code(tmp_path: Path, code: int) -> None:
    """Issue 21, item 13: 3 stays 3 (not 1); 137, a wrapper's word for a child it lost to SIGKILL,
    stays 137, which the controller classes RANK_SIGNAL, not RANK_EXIT."""
    wrapper = ["bash", "-c", f'python3 -c "import sys; print(\'step 1\', flush=True); sys.exit({code})"; exit $?']
    done, paths = _run(tmp_path, wrapper)
    assert done.returncode == code, done.stderr[-2000:]
    assert f"exited with code {code}" in done.stderr
    # The class the controller takes from this rank's exit and its words (a killed process says
    # nothing of its own: 137 is a signal, not an error the script raised).
    rank_errors = (json.loads(paths.rank_error_file(0, 0).read_text())["error"],) \
        if paths.rank_error_file(0, 0).exists() else ()
    classified = classify(FailureEvidence(state=JobState.FAILED, noticed_by="step_exit", exit_code=code,
                                          rank_errors=rank_errors))
    assert classified.failure_class is (FailureClass.RANK_SIGNAL if code > 128 else FailureClass.RANK_EXIT), classified


def test_a_program_that_does_not_exist_is_named(tmp_path: Path) -> None:
    done, paths = _run(tmp_path, ["no-such-trainer", "--lr", "1"])
    assert done.returncode != 0
    error = json.loads(paths.rank_error_file(0, 0).read_text())["error"]
    assert "'no-such-trainer' not found" in error and "PATH" in error
    assert not paths.final.exists()


def test_zero_code_progress_from_log_lines_and_a_short_run_is_not_complete(tmp_path: Path) -> None:
    body = "import time\nfor s in range(1, 4):\n    print(f'step {s} loss 0.1', flush=True); time.sleep(0.1)"
    done, paths = _run(tmp_path, _script(body), steps=10)
    assert done.returncode == 1
    assert "exited 0 at step 3 of 10" in json.loads(paths.rank_error_file(0, 0).read_text())["error"]
    assert [beat["step"] for beat in read_json_lines(paths.heartbeat_file(0, 0))][-1] == 3
    events = {event["event"]: event for event in attempt_event_lines(paths, 0)}
    assert events["first_step"]["step"] == 1 and events["first_step"]["inferred"] is True
    assert events["checkpoint_loaded"]["step"] == 0 and events["checkpoint_loaded"]["inferred"] is True
    assert "step 3 loss" in done.stdout  # the script's output is passed on
    assert not paths.final.exists()


def test_a_restart_that_finds_the_run_already_trained_to_its_end_completes_it(tmp_path: Path) -> None:
    """Issue 27, item 5: the kill came after the script's last step (its final checkpoint written); the
    restart found that checkpoint, ran no step and exited 0: "the script exited 0 at step 0 of 5",
    counted as a failure, the run given up. It is complete, at the step the earlier attempt reached."""
    killed = "import os, signal\nfor s in range(1, 6):\n    print(f'step {s}', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)"
    done, paths = _run(tmp_path, _script(killed), steps=5)
    assert done.returncode != 0 and [beat["step"] for beat in read_json_lines(paths.heartbeat_file(0, 0))][-1] == 5
    done, paths = _run(tmp_path, _script("print('nothing left to train')"), steps=5, attempt=1)
    assert done.returncode == 0, done.stderr
    final = json.loads(paths.final.read_text())
    assert final["step"] == 5 and final["attempt"] == 1
    [completed] = [event for event in attempt_event_lines(paths, 1) if event["event"] == "completed"]
    assert completed["step"] == 5 and completed["inferred"] is True and "attempt 0" in completed["note"]


def test_an_api_script_that_never_calls_done_has_not_finished(tmp_path: Path) -> None:
    done, paths = _run(tmp_path, _script("print('bye')"), progress="api")
    assert done.returncode == 1
    assert "without calling rank.done()" in json.loads(paths.rank_error_file(0, 0).read_text())["error"]


def test_an_api_script_that_dies_of_an_error_is_reported_with_its_cause(tmp_path: Path) -> None:
    body = ("from experiments.runtime import api\nrank = api.init()\nrank.resume()\n"
            "with rank.checkpoint(1):\n    pass\nrank.done(digest='x')")
    done, paths = _run(tmp_path, _script(body), progress="api")
    assert done.returncode == 1
    error = json.loads(paths.rank_error_file(0, 0).read_text())["error"]
    assert "publishing a checkpoint failed" in error and "no rank wrote a file" in error
    assert not paths.final.exists() and not list(paths.checkpoints.glob("step-*"))


def test_zero_code_progress_from_the_scripts_own_checkpoint_files(tmp_path: Path) -> None:
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "ckpt-2.pt").write_bytes(b"an earlier attempt's")
    body = ("import time, pathlib\nfor s in (4, 6):\n    time.sleep(0.8)\n"
            "    pathlib.Path('own', f'ckpt-{s}.pt').write_bytes(b'x')\ntime.sleep(0.8)")
    done, paths = _run(tmp_path, _script(body), steps=6, progress=PROGRESS_CHECKPOINTS)
    assert done.returncode == 0, done.stderr
    beats = [beat["step"] for beat in read_json_lines(paths.heartbeat_file(0, 0))]
    assert set(beats) == {4, 6} and beats == sorted(beats), "each new checkpoint file is a step, in order; the old one none"
    events = {event["event"]: event for event in attempt_event_lines(paths, 0)}
    assert events["checkpoint_loaded"]["step"] == 2 and events["checkpoint_loaded"]["source"] == "script's checkpoints"
    assert events["first_step"]["step"] == 4 and json.loads(paths.final.read_text())["step"] == 6


def test_the_script_dies_with_its_supervisor_even_when_stopped(tmp_path: Path) -> None:
    """A cancelled job's SIGKILL reaches the supervisor; the script (here stopped, as hang-rank
    leaves it) must not outlive it."""
    run_dir = tmp_path / "run"
    command = CommandSpec(argv=(sys.executable, "-c", "import time; time.sleep(600)"), cwd=str(tmp_path))
    job = RankJob(run_id="r", run_dir=str(run_dir), attempt=0, checkpoint_every=0, checkpoint_keep=2,
                  workload=WorkloadSpec(framework="other", steps=5, command=command))
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(rank_job_to_dict(job)))
    supervisor = subprocess.Popen([sys.executable, "-m", "experiments.entry", "--job", str(job_file)])
    identity = RunPaths(run_dir).rank_file(0, 0)
    child = None
    try:
        deadline = time.monotonic() + 30
        while not identity.exists():
            assert time.monotonic() < deadline, "the supervisor never registered the script"
            time.sleep(0.05)
        child = psutil.Process(json.loads(identity.read_text())["pid"])
        child.send_signal(signal.SIGSTOP)
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(timeout=10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert child in gone and not alive
    finally:
        supervisor.kill()
        supervisor.wait(timeout=10)
        if child is not None and child.is_running():  # the one we verified as the script: ours
            child.kill()


# A wrapper, as users launch their trainers (`bash train.sh`): the trainer is its child and writes
# its pid, then steps until it is told to stop.
WRAPPER = """
python3 -c '
import json, os, sys, time
json.dump(os.getpid(), open("trainer.pid", "w"))
for step in range(1, 100000):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
' &
wait
"""


def _started_trainer(tmp_path: Path, deadline_s: float = 30.0) -> tuple[subprocess.Popen, int, RunPaths]:
    """The supervisor (a real rank process) of WRAPPER, once the trainer behind it has written its pid."""
    run_dir = tmp_path / "run"
    command = CommandSpec(argv=("bash", "-c", WRAPPER), cwd=str(tmp_path), progress=PROGRESS_LOG,
                          step_regex=r"^step (\d+)")
    job = RankJob(run_id="r", run_dir=str(run_dir), attempt=0, checkpoint_every=0, checkpoint_keep=2,
                  workload=WorkloadSpec(framework="other", steps=100000, command=command))
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(rank_job_to_dict(job)))
    rank = subprocess.Popen([sys.executable, "-m", "experiments.entry", "--job", str(job_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, ENV_JOB_ID: "4242", "SLURM_PROCID": "0"})  # as a launcher sets them
    pid_file = tmp_path / "trainer.pid"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()):
        time.sleep(0.05)
    assert pid_file.exists(), "the trainer did not start"
    return rank, json.loads(pid_file.read_text()), RunPaths(run_dir)


def _gone(pid: int, deadline_s: float = 10.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _kill_if_alive(pid: int) -> None:
    """The test's own trainer or worker, should it have outlived the test (it may end meanwhile)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).kill()


def test_a_faults_signal_reaches_the_trainer_behind_a_wrapper(tmp_path: Path) -> None:
    """Issue 21, item 12: kill-rank's SIGKILL hit only the wrapper; the trainer, re-parented to
    init, trained on beside the next attempt. The rank leads a process group, which the signal reaches."""
    from injectors.targets import signal_target, verify_rank

    rank, trainer, paths = _started_trainer(tmp_path)
    try:
        identity = json.loads(paths.rank_file(0, 0).read_text())
        assert identity["group"] is True and identity["pid"] != trainer
        target = verify_rank(paths.root, "r", 0, 0, identity["job_id"])
        signal_target(target, signal.SIGKILL)
        assert _gone(trainer), "the trainer behind the wrapper survived the rank's SIGKILL"
        assert rank.wait(timeout=30) == -signal.SIGKILL
    finally:
        rank.kill()
        _kill_if_alive(trainer)


def test_the_trainer_a_wrapper_leaves_behind_ends_with_the_rank(tmp_path: Path) -> None:
    """The wrapper alone dies (a signal aimed at it, an error of its own): what it started ends
    with the rank, at once (no 5 s per output pipe), instead of training on as an orphan."""
    rank, trainer, paths = _started_trainer(tmp_path)
    try:
        wrapper = json.loads(paths.rank_file(0, 0).read_text())["pid"]
        killed_at = time.monotonic()
        os.kill(wrapper, signal.SIGKILL)
        assert rank.wait(timeout=30) == -signal.SIGKILL
        ended_in = time.monotonic() - killed_at
        assert _gone(trainer, deadline_s=1.0), "the trainer trained on after its rank ended"
        assert ended_in < 4.0, f"the rank took {ended_in:.1f} s to end after its script"
    finally:
        rank.kill()
        _kill_if_alive(trainer)


def test_the_schedulers_signal_is_passed_on_to_the_whole_group(tmp_path: Path) -> None:
    """SIGTERM to the rank (a job's end, a preemption's warning path) reaches the trainer itself."""
    rank, trainer, _ = _started_trainer(tmp_path)
    try:
        rank.send_signal(signal.SIGTERM)
        assert _gone(trainer), "SIGTERM did not reach the trainer behind the wrapper"
        rank.wait(timeout=30)
    finally:
        rank.kill()
        _kill_if_alive(trainer)


def test_a_worker_that_left_the_group_is_ended_when_its_parent_dies_late(tmp_path: Path) -> None:
    """Review: the script's group ended, a worker that had left it (setsid) was re-parented to the
    supervisor only once its slow-dying parent was gone, after the one pass that kills: it lived
    on under init. The supervisor kills as long as new orphans come."""
    parent = ("import json, subprocess, time; ballast = bytearray(300 * 2**20); ballast[::4096] = b'x' * len(ballast[::4096]); "
              "worker = subprocess.Popen(['setsid', 'sleep', '300']); json.dump(worker.pid, open('worker.pid', 'w')); "
              "time.sleep(300)")
    wrapper = f"{sys.executable} -c \"{parent}\" & while [ ! -s worker.pid ]; do sleep 0.05; done; echo step 1"
    started = time.monotonic()
    done, _ = _run(tmp_path, ["bash", "-c", wrapper])
    took = time.monotonic() - started
    worker = json.loads((tmp_path / "worker.pid").read_text())
    try:
        assert done.returncode == 0, done.stderr
        assert _gone(worker, deadline_s=1.0), "the worker that left the group outlived its rank"
        assert took < 20, f"the rank took {took:.1f} s"
    finally:
        _kill_if_alive(worker)


def test_a_command_rank_loads_neither_numpy_nor_psutil(tmp_path: Path) -> None:
    """Issue 24, goal 4: a rank that runs the user's script starts as lightly as it can (a sweep of
    1,000 short runs pays its start-up 1,000 times): the built-in runner's modules (NumPy) and
    psutil are never loaded. Its script reads what the supervisor (its parent) has mapped."""
    body = ("import os; maps = open(f'/proc/{os.getppid()}/maps').read(); "
            "open('mapped.txt', 'w').write(maps); print('step 1', flush=True)")
    done, _ = _run(tmp_path, _script(body))
    assert done.returncode == 0, done.stderr
    mapped = (tmp_path / "mapped.txt").read_text()
    assert "/python3" in mapped or "libpython" in mapped  # the parent it read is a Python: the supervisor
    assert "_multiarray_umath" not in mapped, "the command rank's supervisor loaded NumPy"
    assert "_psutil_linux" not in mapped, "the command rank's supervisor loaded psutil"
