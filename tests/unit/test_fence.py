"""Attempt fencing (issue 7, item 1): a stale attempt starts no rank, touches no checkpoint and no
final record, and says so. The batch script is run for real with bash; the rank runtime in-process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from experiments.entry import run_rank
from experiments.layout import RankJob, RunPaths, WorkloadSpec
from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore
from experiments.runtime.fence import Fence, StaleAttemptError, check_current, read_fence, sync_filesystem, write_fence
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.render.scripts import render_pbs, render_slurm

META = CheckpointMeta("test", "raw", "all")


def _run(tmp_path: Path, backend: str):  # noqa: ANN202 - a RunConfig
    campaign = Campaign.model_validate({
        "name": "fence", "backend": backend, "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:05:00"},
    })
    return expand_runs(campaign)[0]


def _fake_launchers(tmp_path: Path) -> dict[str, str]:
    """srun and mpiexec that only leave a mark: the batch script must not reach them when stale."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "mpiexec"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {tmp_path / 'launched'}\n")
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _batch(script, run, env: dict[str, str], job_id: str) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    """The rendered batch script run with bash as job ``job_id`` (the launchers of ``env``); what
    it said on stderr and in its job's log."""
    done = subprocess.run(["bash", "-c", script.text], cwd=run.paths.submitit, env={**env, "SLURM_JOB_ID": job_id},
                          capture_output=True, text=True, timeout=60)
    done.stderr += "".join(path.read_text() for path in run.paths.submitit.glob("*_log.err"))
    return done


@pytest.mark.parametrize("backend", ["slurm", "pbs"])
@pytest.mark.drill
def test_a_stale_attempts_batch_script_starts_no_rank_and_writes_nothing(tmp_path: Path, backend: str) -> None:
    run = _run(tmp_path, backend)
    render = render_slurm if backend == "slurm" else render_pbs
    script = render(run, attempt=0, drill_id="fence-1")
    write_fence(run.paths, Fence(1, "4242"))  # the controller moved on to attempt 1
    run.paths.submitit.mkdir(parents=True)
    done = _batch(script, run, _fake_launchers(tmp_path), "4141")
    logged = done.stderr
    assert done.returncode == 0, logged
    assert "stale attempt: attempt 0 (job 4141)" in logged and "no rank started" in logged
    assert not (tmp_path / "launched").exists(), "the stale attempt launched its ranks"
    assert not any(path.exists() for path in run.paths.event_files(0)), "the stale attempt wrote into the run's files"


@pytest.mark.drill
def test_the_current_attempt_runs_and_a_duplicate_job_of_it_does_not(tmp_path: Path) -> None:
    run = _run(tmp_path, "slurm")
    script = render_slurm(run, attempt=1, drill_id="fence-1")
    run.paths.submitit.mkdir(parents=True)
    env = _fake_launchers(tmp_path)
    write_fence(run.paths, Fence(1, None))  # submitted, not yet accepted: any job of attempt 1 may start
    subprocess.run(["bash", "-c", script.text], cwd=run.paths.submitit, env={**env, "SLURM_JOB_ID": "77"},
                   check=True, timeout=30)
    assert (tmp_path / "launched").read_text() == "srun\n"
    write_fence(run.paths, Fence(1, "77;faultdrill"))  # accepted as job 77 (on a named cluster)
    duplicate = subprocess.run(["bash", "-c", script.text], cwd=run.paths.submitit,
                               env={**env, "SLURM_JOB_ID": "78"}, capture_output=True, text=True, timeout=30)
    assert "stale attempt: attempt 1 (job 78)" in duplicate.stderr
    assert (tmp_path / "launched").read_text() == "srun\n"
    subprocess.run(["bash", "-c", script.text], cwd=run.paths.submitit, env={**env, "SLURM_JOB_ID": "77"},
                   check=True, timeout=30)
    assert (tmp_path / "launched").read_text() == "srun\nsrun\n"


def test_a_stale_rank_refuses_to_start_before_touching_any_file(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_fence(paths, Fence(2, None))
    job = RankJob(run_id="r", run_dir=str(tmp_path), attempt=1, workload=WorkloadSpec(params=2000, steps=5),
                  checkpoint_every=2, checkpoint_keep=1)
    store = CheckpointStore(tmp_path)
    store.sink(2).close()  # a partial checkpoint the current attempt is writing
    with pytest.raises(StaleAttemptError, match="attempt 1 .* is not the run's current one, attempt 2"):
        run_rank(job)
    assert store.partial_dir(2).exists(), "the stale rank cleaned up the current attempt's checkpoint"
    assert not paths.attempt_dir(1).exists() and not paths.heartbeats.exists()


def test_a_fence_that_moves_during_an_attempt_stops_its_commit(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_fence(paths, Fence(0, "10"))
    store = CheckpointStore(tmp_path)
    sink = store.sink(5)
    sink.write_bytes("state.bin", b"x" * 100)
    sink.close()
    write_fence(paths, Fence(1, None))  # the controller took attempt 0 for hung and went on

    def guard() -> None:
        check_current(paths, 0, "10", "publishing a checkpoint")

    with pytest.raises(StaleAttemptError, match="publishing a checkpoint refused"):
        store.commit(5, 0, META, time.monotonic(), None, ranks=1, before_publish=guard)
    assert not store.step_dir(5).exists() and store.newest_valid() is None


def test_a_fenced_out_commit_leaves_the_next_sets_receipts_and_files_as_they_are(tmp_path: Path) -> None:
    """Review (warm sets without rollback): the old set's rank 0 outlives the next attempt's fence
    while it serves its state; its background commit of step 20 found the new set's receipts for
    step 20 (resumed from an older checkpoint), wrote its manifest and unlinked them before the
    fence refused the publish: the new set's own commit then found no receipts."""
    paths = RunPaths(tmp_path)
    write_fence(paths, Fence(4, None))
    store = CheckpointStore(tmp_path)
    for rank in (0, 1):  # the new set's two ranks deliver their shares of step 20
        sink = store.sink(20, rank)
        if rank == 0:
            sink.write_bytes("state.bin", b"new set")
        sink.close()

    def old_rank0_fence() -> None:
        check_current(paths, 3, None, "publishing a checkpoint")

    with pytest.raises(StaleAttemptError):
        store.commit(20, 3, META, time.monotonic(), None, ranks=2, before_publish=old_rank0_fence)
    store.await_receipts(20, 2, 1.0)
    store.commit(20, 4, META, time.monotonic(), None, ranks=2, before_publish=lambda: check_current(paths, 4, None, "x"))
    assert store.newest_valid() is not None and store.newest_valid().step == 20


def test_fence_file_round_trip_and_garbage(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert read_fence(paths) is None
    write_fence(paths, Fence(3, "12;c1"))
    assert read_fence(paths) == Fence(3, "12;c1") and paths.current_attempt.read_text() == "3 12;c1\n"
    fence = read_fence(paths)
    assert fence is not None and fence.admits(3, "12") and not fence.admits(3, "13")
    paths.current_attempt.write_text(json.dumps({"attempt": 3}))
    with pytest.raises(StaleAttemptError, match="refusing to run"):
        read_fence(paths)


def test_a_batch_of_fences_is_made_durable_with_one_sync_of_the_file_system(tmp_path: Path) -> None:
    """A job array's runs are fenced without an fsync each, then synced at once (syncfs)."""
    runs = [RunPaths(tmp_path / f"r{index:03d}") for index in range(20)]
    for index, paths in enumerate(runs):
        write_fence(paths, Fence(0, f"77_{index}"), durable=False)
    sync_filesystem(tmp_path)
    assert [read_fence(paths) for paths in runs] == [Fence(0, f"77_{index}") for index in range(20)]
    assert not list(tmp_path.rglob(".current*tmp*")), "no temporary fence left behind"
    with pytest.raises(FileNotFoundError):
        sync_filesystem(tmp_path / "missing")


def test_a_rank_of_another_drill_is_refused_and_a_run_without_a_fence_admits_no_drills_rank(tmp_path: Path) -> None:
    """Issue 21, item 1: an orphan of an earlier drill (its workdir archived, the same path now a new
    drill's) carries its own drill id: the new drill's fence refuses it, whatever its attempt; a
    run directory with no fence names no attempt of any drill, so a drill's rank may not start."""
    paths = RunPaths(tmp_path / "run")
    with pytest.raises(StaleAttemptError, match="no attempt"):
        check_current(paths, 0, "41", "starting rank 0", drill_id="old-drill")
    check_current(paths, 0, "41", "a rank outside any drill", drill_id=None)  # no drill, no fence to keep
    write_fence(paths, Fence(0, None, drill_id="new-drill"))
    with pytest.raises(StaleAttemptError, match="drill old-drill"):
        check_current(paths, 0, "41", "starting rank 0", drill_id="old-drill")
    check_current(paths, 0, "42", "starting rank 0", drill_id="new-drill")
    assert read_fence(paths) == Fence(0, None, drill_id="new-drill")
    write_fence(paths, Fence(3, "77"))  # a fence written without its drill (the warm coordinator's): as before
    check_current(paths, 3, "77", "starting rank 0", drill_id="any-drill")


@pytest.mark.drill
def test_a_batch_script_of_another_drill_starts_no_rank(tmp_path: Path) -> None:
    run = _run(tmp_path, "slurm")
    script = render_slurm(run, attempt=0, drill_id="old-drill")
    write_fence(run.paths, Fence(0, None, drill_id="new-drill"))  # the same run path, a new drill's attempt 0
    run.paths.submitit.mkdir(parents=True)
    done = _batch(script, run, _fake_launchers(tmp_path), "4141")
    logged = done.stderr
    assert done.returncode == 0 and "stale attempt" in logged and "drill new-drill" in logged, logged
    assert not (tmp_path / "launched").exists(), "another drill's attempt launched its ranks"


def _strategy_run(tmp_path: Path, strategy: str):  # noqa: ANN202 - a RunConfig
    campaign = Campaign.model_validate({
        "name": "fence", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:05:00"},
        "restart": {"strategy": strategy, "relaunch_wait_s": 3},
    })
    return expand_runs(campaign)[0]


@pytest.mark.drill
def test_a_requeued_job_runs_as_the_attempt_the_fence_names_with_its_drill(tmp_path: Path) -> None:
    """The fence's third field (the drill) must not spoil the batch script's reading of its job."""
    run = _strategy_run(tmp_path, "requeue")
    script = render_slurm(run, attempt=0, drill_id="fence-1")
    run.paths.submitit.mkdir(parents=True)
    write_fence(run.paths, Fence(1, "77", drill_id="fence-1"))  # requeued as attempt 1
    done = _batch(script, run, _fake_launchers(tmp_path), "77")
    assert done.returncode == 0 and (tmp_path / "launched").read_text() == "srun\n", done.stderr[-2000:]
    assert run.paths.script_events_file(1).exists() and not run.paths.script_events_file(0).exists()


@pytest.mark.drill
def test_an_in_allocation_job_relaunches_on_a_go_that_names_its_drill(tmp_path: Path) -> None:
    run = _strategy_run(tmp_path, "in-allocation")
    script = render_slurm(run, attempt=0, drill_id="fence-1")
    run.paths.submitit.mkdir(parents=True)
    env = _fake_launchers(tmp_path)
    srun = Path(env["PATH"].split(":")[0]) / "srun"  # the first launch fails, the next succeeds
    srun.write_text(f"#!/bin/sh\necho srun >> {tmp_path / 'launched'}\n"
                    f"[ -f {tmp_path / 'once'} ] && exit 0\ntouch {tmp_path / 'once'}\nexit 1\n")
    write_fence(run.paths, Fence(0, "77", drill_id="fence-1"))

    def go_when_the_first_launch_failed() -> None:
        deadline = time.monotonic() + 20
        while not (tmp_path / "once").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        write_fence(run.paths, Fence(1, "77", drill_id="fence-1"))

    import threading
    go = threading.Thread(target=go_when_the_first_launch_failed)
    go.start()
    done = _batch(script, run, env, "77")
    go.join()
    assert (tmp_path / "launched").read_text() == "srun\nsrun\n", done.stderr[-2000:]
    assert run.paths.script_events_file(1).exists(), "relaunched as attempt 1"


def test_a_warm_coordinator_moves_the_fence_only_over_the_attempt_it_holds(tmp_path: Path) -> None:
    """Hardening issue, item 17: the controller moved the fence on (it replaced the job); the warm
    job's coordinator, planning its next generation, must not write over it."""
    from experiments.warm.coordinator import CoordinatorGaveUp
    from experiments.warm.held_fence import HeldFence

    paths = RunPaths(tmp_path)
    write_fence(paths, Fence(3, "700", "d1"))  # the controller fenced the warm job's first attempt
    held = HeldFence(paths, Fence(3, "700", "d1"))
    held.advance(4)  # a generation of the same job: the fence still names it
    assert read_fence(paths) == Fence(4, "700", "d1")
    write_fence(paths, Fence(5, "800", "d1"))  # the controller took the job for hung and replaced it
    with pytest.raises(CoordinatorGaveUp, match="moved on"):
        held.advance(5)
    assert read_fence(paths) == Fence(5, "800", "d1"), "the controller's fence was written over"
    assert read_fence(paths).admits(5, "800", "d1") and not read_fence(paths).admits(5, "700", "d1")


def test_a_restarted_controller_never_moves_a_warm_jobs_fence_back(tmp_path: Path) -> None:
    """Review of item 17: the coordinator fenced generation 1 (attempt 4) while no controller ran;
    the next controller adopts attempt 3 of the same job and rewrote 'attempt 3', fencing the
    running generation out. Another job's or an earlier attempt's fence is replaced as ever."""
    from experiments.runtime.fence import write_fence_unless_ahead

    paths = RunPaths(tmp_path)
    write_fence(paths, Fence(4, "700", "d1"))
    write_fence_unless_ahead(paths, Fence(3, "700", "d1"))
    assert read_fence(paths) == Fence(4, "700", "d1")
    write_fence_unless_ahead(paths, Fence(3, "800", "d1"))  # another job: the controller's word stands
    assert read_fence(paths) == Fence(3, "800", "d1")
