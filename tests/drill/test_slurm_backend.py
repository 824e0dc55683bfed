"""The Slurm backend's commands and how it reads their output (issue 7, items 2 and 10), with
recorded scheduler output: multi-cluster ids keep their cluster (-M on every command), a failing
sacct is a failed poll (never "vanished"), cancel errors surface, retries apply with check=False,
and duplicates of a submission are listed oldest first. The real commands: tests/cluster."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fake_commands import FakeCommands, install
from orchestrator.backends.base import AttemptRef
from orchestrator.backends.slurm.backend import (
    ACCOUNTING_GRACE_S,
    SlurmBackend,
    parse_duration,
    parse_scontrol_record,
    parse_slurm_time,
)
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.commands import CommandError, run_command
from orchestrator.render.scripts import attempt_job_name
from orchestrator.states import JobState


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCommands:
    return install(tmp_path, monkeypatch, ("sbatch", "squeue", "sacct", "scancel", "srun", "scontrol"))


def _run(tmp_path: Path, directives: list[str]):  # noqa: ANN202 - a RunConfig
    campaign = Campaign.model_validate({
        "name": "unit", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 2, "extra_directives": directives},
    })
    return expand_runs(campaign)[0]


def test_a_job_on_a_named_cluster_is_polled_cancelled_and_reached_there(fake: FakeCommands, tmp_path: Path) -> None:
    backend = SlurmBackend("d-1", python="/opt/py")
    fake.answer("squeue", "41|RUNNING\n")
    fake.answer("sacct", "42|COMPLETED\n")
    states = backend.poll(["41;gpu", "42;gpu", "7"])
    assert states == {"41;gpu": JobState.RUNNING, "42;gpu": JobState.COMPLETED, "7": JobState.UNKNOWN}
    assert fake.calls[:2] == ["squeue -M gpu -h -r -t all -u root -o %i|%T",
                              "sacct -M gpu -X -n -P -o JobID,State -j 42"]
    assert "squeue -h -r -t all -u root -o %i|%T" in fake.calls  # the job without a cluster: no -M
    backend.cancel("41;gpu")
    backend.cancel("41;gpu", force=True)
    assert fake.calls[-2:] == ["scancel -M gpu 41", "scancel -M gpu -s KILL 41"]


def test_the_fault_agent_reaches_a_job_on_a_named_cluster(fake: FakeCommands, tmp_path: Path) -> None:
    from injectors.schedule import PlannedFault
    from orchestrator.faults.inject import FaultRequest, inject

    run = _run(tmp_path, ["--clusters=gpu"])
    identity = run.paths.rank_file(0, 1)
    identity.parent.mkdir(parents=True)
    identity.write_text('{"rank": 1, "pid": 9, "create_time": 0, "host": "n2", "node": "n2", "job_id": "41", '
                        '"attempt": 0}')
    fake.answer("srun", '{"ok": true, "kind": "kill-rank", "target": "rank 1@n2", "pid": 9, "node": "n2", '
                        '"signal": "SIGKILL", "at": 5.0, "detail": ""}\n')
    fault = PlannedFault(index=0, kind="kill-rank", delay_s=0.0, anchor="training_start", ranks=(1,),
                         options={"signal": "SIGKILL"})
    inject(SlurmBackend("d-1", python="/opt/py"), FaultRequest(run, 0, "41;gpu", fault))
    [call] = fake.calls
    assert call.startswith("srun -M gpu --jobid=41 --job-name=faultdrill-agent --overlap") and '"job_id": "41"' in call


def test_a_failing_sacct_is_a_failed_poll_not_a_vanished_job(fake: FakeCommands) -> None:
    fake.answer("squeue", "")
    fake.answer("sacct", "", rc=1, stderr="sacct: error: slurmdbd: Connection refused")
    with pytest.raises(CommandError, match="sacct"):
        SlurmBackend("d-1").poll(["43"])


NO_DBD = "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection: Connection refused"


@pytest.mark.parametrize("storage", ["accounting_storage/none", "(null)"])  # Slurm < 23.11; 23.11 and later
def test_a_site_without_accounting_is_drilled_from_the_queue_and_says_so(fake: FakeCommands, storage: str) -> None:
    """Issue 22, item 5: no AccountingStorageType (recorded `scontrol show config`): a job that
    left the queue ended in a state not known, at once, never a failed poll."""
    fake.answer("scontrol", f"MaxArraySize            = 1001\nAccountingStorageType   = {storage}\n")
    fake.answer("squeue", "44|RUNNING\n")
    fake.answer("sacct", "", rc=1, stderr="sacct: error: Slurm accounting storage is disabled")
    backend = SlurmBackend("d-1")
    assert backend.poll(["43", "44"]) == {"43": JobState.UNKNOWN, "44": JobState.RUNNING}
    assert "how it ended" in backend.vanished_why()
    [note] = backend.site_notes()
    assert "accounting storage is disabled" in note and "left the queue" in note


def test_accounting_that_stays_down_past_its_grace_is_done_without(fake: FakeCommands,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmdbd down (configured, not answering): the poll fails while it may come back, then the
    drill goes on from the queue; once sacct answers again, it is used again."""
    from orchestrator.backends.slurm import backend as slurm

    monkeypatch.setattr(slurm, "ACCOUNTING_GRACE_S", 0.2)
    fake.answer("scontrol", "AccountingStorageType   = accounting_storage/slurmdbd\n")
    fake.answer("squeue", "")
    fake.answer("sacct", "", rc=1, stderr=NO_DBD)
    backend = SlurmBackend("d-1")
    with pytest.raises(CommandError, match="Connection refused"):
        backend.poll(["43"])
    assert backend.site_notes() == [], "while it may come back, the drill has not gone without it"
    time.sleep(0.25)
    assert backend.poll(["43"]) == {"43": JobState.UNKNOWN}
    assert "Connection refused" in backend.site_notes()[0] and "how it ended" in backend.vanished_why()
    fake.answer("sacct", "43|TIMEOUT\n")
    assert backend.poll(["43", "47"]) == {"43": JobState.TIMEOUT, "47": JobState.UNKNOWN}
    assert backend.vanished_why() == "job vanished from the scheduler", "accounting answers again"
    assert "Connection refused" in backend.site_notes()[0], "the report still says the drill went without it"


def test_an_old_failure_of_sacct_elsewhere_does_not_spend_the_polls_grace(fake: FakeCommands,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One sacct error in end_time, then none needed for a long time: a poll that meets an outage
    later still waits for accounting (review of issue 22)."""
    from orchestrator.backends.slurm import backend as slurm

    monkeypatch.setattr(slurm, "ACCOUNTING_GRACE_S", 0.2)
    fake.answer("scontrol", "AccountingStorageType   = accounting_storage/slurmdbd\n")
    fake.answer("sacct", "", rc=1, stderr=NO_DBD)
    backend = SlurmBackend("d-1")
    assert backend.end_time("43") is None
    time.sleep(0.25)
    fake.answer("squeue", "")
    with pytest.raises(CommandError):
        backend.poll(["43"])


def test_the_poll_waits_for_accounting_less_than_the_controller_waits_for_the_scheduler() -> None:
    backend = SlurmBackend("d-1")
    backend.set_patience(40.0)
    assert backend.accounting_grace_s == 20.0
    backend.set_patience(3600.0)
    assert backend.accounting_grace_s == ACCOUNTING_GRACE_S


def test_a_lost_submission_is_looked_for_in_the_queue_when_accounting_does_not_answer(
        fake: FakeCommands, tmp_path: Path) -> None:
    """A failed sbatch's lookup raised on every retry (SUBMIT_FAILED) where sacct fails."""
    run = _run(tmp_path, [])
    name = attempt_job_name(run, 0, "d-1")
    fake.answer("squeue", "112\n")
    fake.answer("sacct", "", rc=1, stderr=NO_DBD)
    backend = SlurmBackend("d-1")
    assert backend.find_submitted(AttemptRef(run, 0, name, None, 1.0e9)) == ["112"]
    assert backend.site_notes(), "the report says what the drill knew less of"


def test_a_failing_scancel_is_retried_then_raised(fake: FakeCommands) -> None:
    fake.answer("scancel", "", rc=1, stderr="scancel: error: Unable to contact slurm controller")
    with pytest.raises(CommandError, match="Unable to contact"):
        SlurmBackend("d-1").cancel("44")
    assert fake.calls.count("scancel 44") == 3


def test_retries_apply_when_check_is_off(fake: FakeCommands) -> None:
    fake.answer("srun", "", rc=1)
    result = run_command(["srun", "true"], retries=2, retry_delay_s=0.0, check=False)
    assert result.returncode == 1 and fake.calls == ["srun true"] * 3


def test_every_job_of_an_unrecorded_attempt_is_found_oldest_first(fake: FakeCommands, tmp_path: Path) -> None:
    run = _run(tmp_path, [])
    name = attempt_job_name(run, 0, "d-1")
    fake.answer("squeue", "112\n98\n")  # squeue sorts by priority: not the submission order
    fake.answer("sacct", "97\n98\n")  # one that squeue has forgotten already
    assert SlurmBackend("d-1").find_submitted(AttemptRef(run, 0, name, None, 1.0e9)) == ["97", "98", "112"]
    assert f"squeue -h -t all -u root -n {name} -o %i" in fake.calls


def test_job_names_are_unique_per_drill_run_and_attempt_even_when_long(tmp_path: Path) -> None:
    campaign = Campaign.model_validate({
        "name": "a" * 60, "workdir": str(tmp_path / "w"), "baseline": True,
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "sweep": {"grid": {"workload.batch_size": [8, 16]}},
    })
    runs = expand_runs(campaign)
    drill_id = f"{campaign.name}-0123abcd"
    names = [attempt_job_name(run, attempt, drill_id) for run in runs for attempt in (0, 1)]
    assert len(set(names)) == len(names) == 8, names  # a run and its -baseline twin no longer collide
    assert all(len(name) <= 120 and name.endswith(("-a0", "-a1")) for name in names)
    assert attempt_job_name(runs[0], 0, "other-drill") not in names  # another drill's jobs are not ours


def test_sacct_times_are_read_as_local_time() -> None:
    assert parse_slurm_time("Unknown") is None
    assert parse_slurm_time("2026-12-01T07:50:01") is not None


# Recorded from this machine's Slurm 22.05 (scontrol show job -o), trimmed.
SHOW_JOB = ("JobId=857 JobName=fd-fault-catalogue-1c4892cb-r004-a0 UserId=root(0) JobState=RUNNING Reason=None "
            "RunTime=00:01:07 TimeLimit=00:20:00 StartTime=2026-12-01T11:24:01 NodeList=fd-n[1-2] "
            "BatchHost=fd-n1 NumNodes=2 NumCPUs=2 Command=/var/tmp/x/submission.sh\n")


@pytest.mark.parametrize("text,seconds", [("00:01:07", 67.0), ("1-02:00:00", 93600.0), ("05:09", 309.0),
                                          ("", None), ("INVALID", None), ("1:2:3:4", None)])
def test_slurm_durations_are_read_in_seconds(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_job_nodes_come_from_the_scheduler_in_allocation_order(tmp_path: Path, fake: FakeCommands) -> None:
    fake.answer("scontrol", SHOW_JOB)
    assert parse_scontrol_record(SHOW_JOB)["BatchHost"] == "fd-n1"
    assert SlurmBackend("d1").job_nodes("857") == ["fd-n1", "fd-n2"]
    assert fake.calls[-1] == "scontrol show job -o 857"


def test_the_walltime_moves_to_the_run_time_plus_the_wanted_seconds_in_whole_minutes(
        tmp_path: Path, fake: FakeCommands) -> None:
    fake.answer("scontrol", SHOW_JOB)
    said = SlurmBackend("d1").set_time_left("857;other", 30)
    # 67 s run + 30 s = 97 s: Slurm keeps minutes, so 2 (never less than what was asked).
    assert fake.calls[-1] == "scontrol -M other update JobId=857 TimeLimit=2"
    assert said.said == "time limit set to 2 min (it had run 67 s)" and said.ends_within_s == 53.0


def test_the_warning_goes_to_the_job_steps_not_the_batch_script(tmp_path: Path, fake: FakeCommands) -> None:
    SlurmBackend("d1").signal_ranks("857", "SIGUSR2")
    assert fake.calls[-1] == "scancel --signal=USR2 857"


def _sweep(tmp_path: Path, points: int):  # noqa: ANN202 - RunConfigs
    campaign = Campaign.model_validate({
        "name": "unit", "backend": "slurm", "workdir": str(tmp_path / "work"), "parallel_runs": 2,
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 2}, "sweep": {"grid": {"workload.seed": list(range(points))}},
    })
    return expand_runs(campaign)


def test_runs_go_out_as_one_throttled_array_whose_elements_are_their_attempts(fake: FakeCommands,
                                                                               tmp_path: Path) -> None:
    from experiments.layout import RankJob

    runs = _sweep(tmp_path, 3)
    jobs = [RankJob(run_id=run.run_id, run_dir=str(run.paths.root), attempt=0, workload=run.workload,
                    checkpoint_every=5, checkpoint_keep=2) for run in runs]
    fake.answer("sbatch", "900\n")
    submissions = SlurmBackend("d-1", python="/opt/py").submit_array(list(zip(runs, jobs, strict=False)))
    assert [s.job_id for s in submissions] == ["900_0", "900_1", "900_2"]
    script = (tmp_path / "work" / "arrays" / "900_submission.sh").read_text()
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --output=%A_%a_batch.out" in script
    for index, run in enumerate(runs):  # each element: its run's folder, fence and pickle
        assert f"  {index})\n" in script and f"folder={run.paths.submitit}\n" in script
        assert f"fence={run.paths.current_attempt}\n" in script
        assert (run.paths.submitit / f"900_{index}_submitted.pkl").exists()
    assert not list((tmp_path / "work").rglob(".pending-*"))


def test_an_array_element_is_polled_found_again_and_reached_by_its_own_number(fake: FakeCommands,
                                                                             tmp_path: Path) -> None:
    backend = SlurmBackend("d-1", python="/opt/py")
    fake.answer("squeue", "900_0|RUNNING\n900_1|PENDING\n")  # -r: pending elements one a line
    assert backend.poll(["900_0", "900_1"]) == {"900_0": JobState.RUNNING, "900_1": JobState.PENDING}
    run = _sweep(tmp_path, 2)[1]
    fake.answer("squeue", "900_1\n")
    fake.answer("sacct", "")
    assert backend.find_submitted(AttemptRef(run, 0, "fd-array", 1, 1.0e9)) == ["900_1"]
    fake.answer("scontrol", "JobId=905 ArrayJobId=900 ArrayTaskId=1 JobState=RUNNING\n")
    fake.answer("srun", "")
    backend.run_agent("900_1", "n1", ["-m", "injectors.agent"], timeout_s=5)
    assert any(call.startswith("srun --jobid=905 ") for call in fake.calls)  # srun refuses 900_1


def test_a_hung_attempts_rank_step_is_killed_never_the_next_attempts(fake: FakeCommands) -> None:
    """In-allocation: the batch script may start attempt 1's step while attempt 0's is being ended;
    each step is named with its attempt, and only the hung attempt's is signalled."""
    backend = SlurmBackend("d-1", python="/opt/py")
    fake.answer("squeue", "15.batch|batch\n15.0|faultdrill-ranks-0\n15.1|faultdrill-ranks-1\n")
    assert backend.kill_rank_step("15", attempt=0, started_before=0.0) is True
    assert fake.calls == ["squeue -h -s -j 15 -o %i|%j", "scancel --signal=KILL 15.0"]
