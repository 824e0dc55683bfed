"""experiments/task.py, the task runner of every Slurm and PBS job, as a real process: it runs
submitit's pickled call without loading submitit or NumPy (a short job's start-up: issue 24, goal
4), writes the outcome where submitit's ``job.result()`` reads it, and fails as submitit's runner
fails. The Slurm and PBS drills of tests/cluster run every rank through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.layout import ENV_JOB_ID, PROGRESS_LOG, CommandSpec, RankJob, WorkloadSpec

JOB_ID = "4711_3"  # an array element, as submitit names it
OWN_JOB = {ENV_JOB_ID: JOB_ID, "SLURM_ARRAY_JOB_ID": "4711", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "4714"}


def _dump(folder: Path, function: object, *args: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    submitit_utils.DelayedSubmission(function, *args).dump(folder / f"{JOB_ID}_submitted.pkl")


def _task(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "PBS_", "SUBMITIT_"))}
    return subprocess.run([sys.executable, "-X", "importtime", "-u", "-m", "experiments.task", str(folder)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _command_job(tmp_path: Path) -> RankJob:
    command = CommandSpec(argv=(sys.executable, "-c", "print('step 1', flush=True)"), cwd=str(tmp_path), progress=PROGRESS_LOG,
                          step_regex=r"^step (\d+)")
    return RankJob(run_id="r", run_dir=str(tmp_path / "run"), attempt=0, checkpoint_every=0, checkpoint_keep=2,
                   workload=WorkloadSpec(framework="other", steps=1, command=command))


def test_a_rank_runs_from_submitits_pickle_without_submitit_or_numpy(tmp_path: Path) -> None:
    folder = tmp_path / "drill-4711" / "submitit"  # the workdir named after the array: %A, as submitit fills it
    _dump(folder, run_rank, _command_job(tmp_path))
    done = _task(tmp_path / "drill-%A" / "submitit", OWN_JOB)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome, result = submitit_utils.pickle_load(folder / f"{JOB_ID}_0_result.pkl")
    assert outcome == "success" and result["exit_code"] == 0 and result["rank"] == 0
    assert json.loads((tmp_path / "run" / "final.json").read_text())["step"] == 1
    loaded = _imported(done.stderr)
    assert "experiments.entry" in loaded, "the import log is read: the rank's own modules are in it"
    assert not {"submitit", "numpy", "asyncio"} & loaded, sorted({"submitit", "numpy", "asyncio"} & loaded)


def test_a_call_that_raises_leaves_submitits_error_and_fails_the_task(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    _dump(folder, json.loads, "{not json")
    done = _task(folder, OWN_JOB)
    assert done.returncode == 1 and "JSONDecodeError" in done.stderr
    outcome, trace = submitit_utils.pickle_load(folder / f"{JOB_ID}_0_result.pkl")
    assert outcome == "error" and "JSONDecodeError" in trace


def test_a_rank_that_exits_with_its_own_code_keeps_it(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    _dump(folder, sys.exit, 7)
    done = _task(folder, OWN_JOB)
    assert done.returncode == 7, done.stderr[-2000:]
    assert not (folder / f"{JOB_ID}_0_result.pkl").exists(), "as submitit's runner: an exit is no outcome"


@pytest.mark.parametrize("named", [None, "999_1"], ids=["none", "another-jobs"])
def test_without_this_jobs_id_submitits_own_runner_runs_the_call(tmp_path: Path, named: str | None) -> None:
    folder = tmp_path / "submitit"
    _dump(folder, run_rank, _command_job(tmp_path))
    done = _task(folder, {**({ENV_JOB_ID: named} if named else {}),
                          "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4711", "SLURM_ARRAY_JOB_ID": "4711",
                          "SLURM_ARRAY_TASK_ID": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
                          "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    outcome, _ = submitit_utils.pickle_load(folder / f"{JOB_ID}_0_result.pkl")
    assert outcome == "success" and "submitit" in _imported(done.stderr)
