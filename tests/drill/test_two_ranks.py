"""Two real ranks per framework on this machine: a run to completion, then a rank killed mid-run
and resumed, which must end bit for bit where the uninterrupted run ended.

(a) goes through submitit's LocalExecutor, as the local backend runs ranks; (b) starts the ranks as
plain subprocesses with the same SUBMITIT_LOCAL_* variables, so the test sees each rank's exit code
and can time the survivor's exit. Every wait is a poll with a deadline. (Chainer's ranks come from
mpiexec: tests/drill/test_chainer_two_ranks.py.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import submitit

from experiments.entry import rank_job_to_dict, run_rank
from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
    read_json_lines,
)
from rank_launch import REPO, free_port_pair, logs, wait_for

# The survivor ends within one collective timeout (FAULTDRILL_COLLECTIVE_TIMEOUT_S, 5 s here) and a
# margin: a kill during a step is seen at once (~0.12 s), one during an eager collective between
# steps (TensorFlow's warning poll, every WARNING_POLL_STEPS) only at its timeout (measured: 3 of 16
# tries, 5.1-5.2 s). Hung past it is what this guards against.
SURVIVOR_EXIT_LIMIT_S = 5.0 + 2.0


@dataclass(frozen=True)
class Case:
    """Small and fast: steps of a few ms, so a kill after the first checkpoint lands well before
    the end; an attempt costs mostly the framework's import and start-up."""

    spec: WorkloadSpec
    every: int
    writers: str
    files: tuple[str, ...]  # one published checkpoint directory
    reference_timeout_s: float


CASES = {
    "torch": Case(WorkloadSpec(params=2000, steps=600, batch_size=16, seed=3), 50, "all",
                  ("manifest.json", "model.pt", "rng-rank00000.pt", "rng-rank00001.pt"), 120),
    "tensorflow": Case(WorkloadSpec(framework="tensorflow", params=2000, steps=200, batch_size=16, seed=3), 20,
                       "rank0", ("ckpt.data-00000-of-00001", "ckpt.index", "manifest.json"), 150),
}
KEEP = 3


def _installed(framework: str) -> bool:
    return importlib.util.find_spec(framework) is not None  # the ranks import it, this process need not


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    if not _installed(request.param):
        pytest.skip(f"{request.param} is not installed")
    return CASES[request.param]


def rank_job(case: Case, run_dir: Path, attempt: int) -> RankJob:
    return RankJob(run_id=f"{case.spec.framework}-two-ranks", run_dir=str(run_dir), attempt=attempt,
                   workload=case.spec, checkpoint_every=case.every, checkpoint_keep=KEEP, heartbeat_interval_s=0.05)


def rank_env(rank: int, job_id: str, port: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "SUBMITIT_LOCAL_JOB_ID": job_id,
            "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank),
            "SUBMITIT_LOCAL_NTASKS": "2", "FAULTDRILL_MASTER_PORT": str(port),
            "FAULTDRILL_COLLECTIVE_TIMEOUT_S": "5"}


def launch(case: Case, run_dir: Path, attempt: int) -> list[subprocess.Popen[bytes]]:
    job_file = run_dir / f"job-{attempt}.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file.write_text(json.dumps(rank_job_to_dict(rank_job(case, run_dir, attempt))))
    port, job_id = free_port_pair(), f"test-{os.getpid()}-{attempt}"
    procs = []
    for rank in range(2):
        with open(run_dir / f"rank{rank}-attempt{attempt}.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "experiments.entry", "--job", str(job_file)],
                env=rank_env(rank, job_id, port), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            ))
    return procs


@pytest.fixture(scope="module")
def reference(case: Case, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """Run (a): uninterrupted, through submitit's LocalExecutor with two tasks."""
    run_dir = tmp_path_factory.mktemp(f"reference-{case.spec.framework}")
    with pytest.MonkeyPatch.context() as patch:
        # The executor's controller and tasks inherit this process's environment.
        patch.setenv("PYTHONPATH", str(REPO))
        patch.setenv("FAULTDRILL_MASTER_PORT", str(free_port_pair()))
        patch.setenv("FAULTDRILL_COLLECTIVE_TIMEOUT_S", "5")
        executor = submitit.LocalExecutor(folder=str(RunPaths(run_dir).submitit))
        executor.update_parameters(tasks_per_node=2, timeout_min=3)
        job = executor.submit(run_rank, rank_job(case, run_dir, attempt=0))
    wait_for(job.done, case.reference_timeout_s, "the reference run", interval_s=0.1)
    yield run_dir, job.results()


def test_reference_run_completes(case: Case, reference: tuple[Path, list[dict[str, Any]]]) -> None:
    run_dir, results = reference
    paths, steps = RunPaths(run_dir), case.spec.steps
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["digest"] for r in results} == {results[0]["digest"]}
    assert all(r["final_step"] == steps and r["resumed_from"] == 0 for r in results)
    final = json.loads(paths.final.read_text())
    assert final["digest"] == results[0]["digest"] and final["step"] == steps
    kept = [f"step-{step:08d}" for step in range(steps - (KEEP - 1) * case.every, steps + 1, case.every)]
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == kept
    assert tuple(sorted(p.name for p in (paths.checkpoints / kept[-1]).iterdir())) == case.files
    records = read_json_lines(paths.checkpoint_log)
    assert [r["step"] for r in records] == list(range(case.every, steps + 1, case.every))
    assert all(r["writers"] == case.writers and r["framework"] == case.spec.framework and r["bytes"] > 0
               for r in records)
    events = [e["event"] for e in attempt_event_lines(paths, 0)]
    assert events[0] == "process_start" and events[-1] == EVENT_COMPLETED
    identities = [json.loads(paths.rank_file(0, rank).read_text()) for rank in range(2)]
    assert len({i["pid"] for i in identities}) == 2 and {i["job_id"] for i in identities} == {identities[0]["job_id"]}


def test_killed_rank_then_resume_matches_reference(
    case: Case, reference: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    paths = RunPaths(tmp_path)
    procs = launch(case, tmp_path, attempt=0)
    try:
        wait_for(lambda: read_json_lines(paths.checkpoint_log) or any(p.poll() is not None for p in procs),
                 90, "the first checkpoint")
        assert all(p.poll() is None for p in procs), logs(tmp_path)
        victim = json.loads(paths.rank_file(0, 1).read_text())
        assert victim["pid"] == procs[1].pid  # the identity file names the process to hit
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        survivor_rc = procs[0].wait(timeout=60)
        survivor_exit_s = time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert survivor_rc != 0, logs(tmp_path)
    assert survivor_exit_s < SURVIVOR_EXIT_LIMIT_S, f"survivor took {survivor_exit_s:.2f} s to exit"
    assert not paths.final.exists(), "the kill came too late: the run had already finished"

    procs = launch(case, tmp_path, attempt=1)
    codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [0, 0], logs(tmp_path)
    loaded = next(e for e in attempt_event_lines(paths, 1) if e["event"] == EVENT_CHECKPOINT_LOADED)
    assert loaded["step"] > 0
    assert json.loads(paths.final.read_text())["digest"] == reference[1][0]["digest"]
