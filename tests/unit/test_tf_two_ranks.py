"""Two real TensorFlow ranks (MultiWorkerMirroredStrategy over loopback gRPC) on this machine.

(a) an uninterrupted run through submitit's LocalExecutor, as the local backend runs ranks; (b) the
same run started as plain subprocesses with the same SUBMITIT_LOCAL_* variables, rank 1 SIGKILLed
once the first checkpoint is published: rank 0 must exit non-zero within seconds, and attempt 1
must resume from that checkpoint and end with (a)'s digest, bit for bit. Every wait is a poll with
a deadline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

if importlib.util.find_spec("tensorflow") is None:  # the ranks import it, this process need not
    pytest.skip("tensorflow is not installed", allow_module_level=True)
submitit = pytest.importorskip("submitit")

from experiments.entry import rank_job_to_dict, run_rank  # noqa: E402
from experiments.layout import (  # noqa: E402
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    EVENT_FRAMEWORK_READY,
    RankJob,
    RunPaths,
    WorkloadSpec,
    read_json_lines,
)

REPO = Path(__file__).resolve().parents[2]
# Steps of a few ms: the kill after the first checkpoint (step 20) lands 180 steps before the end.
# An attempt costs mostly TensorFlow's import, the cluster's start and the trace (~5 s a rank).
SPEC = WorkloadSpec(framework="tensorflow", params=2000, steps=200, batch_size=16, seed=3)
EVERY, KEEP = 20, 3
SURVIVOR_EXIT_LIMIT_S = 5.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port_pair() -> int:
    """A port p with p and p + 1 free: TensorFlow listens on one port per rank (explicit ports
    are used as a block, master_port + local slot)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def rank_job(run_dir: Path, attempt: int) -> RankJob:
    return RankJob(run_id="tf-two-ranks", run_dir=str(run_dir), attempt=attempt, workload=SPEC,
                   checkpoint_every=EVERY, checkpoint_keep=KEEP, heartbeat_interval_s=0.05)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def rank_env(rank: int, job_id: str, port: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "SUBMITIT_LOCAL_JOB_ID": job_id,
            "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank),
            "SUBMITIT_LOCAL_NTASKS": "2", "FAULTDRILL_MASTER_PORT": str(port),
            "FAULTDRILL_COLLECTIVE_TIMEOUT_S": "5"}


def launch(run_dir: Path, attempt: int) -> list[subprocess.Popen[bytes]]:
    job_file = run_dir / f"job-{attempt}.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file.write_text(json.dumps(rank_job_to_dict(rank_job(run_dir, attempt))))
    port, job_id = free_port_pair(), f"test-{os.getpid()}-{attempt}"
    procs = []
    for rank in range(2):
        log = open(run_dir / f"rank{rank}-attempt{attempt}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "experiments.entry", "--job", str(job_file)],
            env=rank_env(rank, job_id, port), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        ))
        log.close()
    return procs


def logs(run_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(run_dir.glob("rank*.log")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """Run (a): uninterrupted, through submitit's LocalExecutor with two tasks."""
    run_dir = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as patch:
        # The executor's tasks inherit this environment: both listen on loopback, port and port+1.
        patch.setenv("PYTHONPATH", str(REPO))
        patch.setenv("FAULTDRILL_MASTER_PORT", str(free_port_pair()))
        patch.setenv("FAULTDRILL_COLLECTIVE_TIMEOUT_S", "5")
        executor = submitit.LocalExecutor(folder=str(RunPaths(run_dir).submitit))
        executor.update_parameters(tasks_per_node=2, timeout_min=3)
        job = executor.submit(run_rank, rank_job(run_dir, attempt=0))
    wait_for(job.done, 150, "the reference run", interval_s=0.1)
    results = job.results()
    yield run_dir, results
    assert job.job_id  # keeps the job object (and its files) alive for the module


def test_reference_run_completes(reference: tuple[Path, list[dict[str, Any]]]) -> None:
    run_dir, results = reference
    paths = RunPaths(run_dir)
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["digest"] for r in results} == {results[0]["digest"]}
    assert all(r["final_step"] == SPEC.steps and r["resumed_from"] == 0 for r in results)
    final = json.loads(paths.final.read_text())
    assert final["digest"] == results[0]["digest"] and final["step"] == SPEC.steps
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == [
        "step-00000160", "step-00000180", "step-00000200"]
    # Only the chief's files are published, and no scratch directory travels with them.
    assert sorted(p.name for p in (paths.checkpoints / "step-00000200").iterdir()) == [
        "ckpt.data-00000-of-00001", "ckpt.index", "manifest.json"]
    records = read_json_lines(paths.checkpoint_log)
    assert [r["step"] for r in records] == list(range(EVERY, SPEC.steps + 1, EVERY))
    assert all(r["writers"] == "rank0" and r["framework"] == "tensorflow" and r["bytes"] > 0 for r in records)
    events = read_json_lines(paths.events_file(0))
    assert events[0]["event"] == "process_start" and events[-1]["event"] == EVENT_COMPLETED
    ready = next(e for e in events if e["event"] == EVENT_FRAMEWORK_READY)
    print(f"framework_ready {ready['since_start_s']:.2f} s after start (cluster {ready['rendezvous_s']:.2f} s)")


def test_killed_rank_then_resume_matches_reference(
    reference: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    paths = RunPaths(tmp_path)
    procs = launch(tmp_path, attempt=0)
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

    procs = launch(tmp_path, attempt=1)
    codes = [proc.wait(timeout=120) for proc in procs]
    assert codes == [0, 0], logs(tmp_path)
    loaded = next(e for e in read_json_lines(paths.events_file(1)) if e["event"] == EVENT_CHECKPOINT_LOADED)
    assert loaded["step"] > 0
    assert json.loads(paths.final.read_text())["digest"] == reference[1][0]["digest"]
    print(f"survivor exited {survivor_exit_s:.3f} s after its peer was killed; resumed from {loaded['step']}")
