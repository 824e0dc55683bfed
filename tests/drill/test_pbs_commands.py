"""The PBS command layer, the submitit plugin's executor and watcher, and the backend, against fake
qsub/qstat/qdel/qrerun on PATH that log their arguments and print recorded outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

import orchestrator.backends.pbs.backend as pbs_backend
from experiments.layout import RankJob
from fake_commands import FAKE, FakeCommands, install
from injectors.schedule import PlannedFault
from orchestrator.backends.base import AttemptRef
from orchestrator.backends.pbs import commands as pbs_commands
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.pbs.commands import (
    SCHEDULER_ID_FILE,
    ServerKind,
    detect_server,
    qdel,
    qrerun,
    qstat_states,
)
from orchestrator.backends.pbs.plugin import PBSExecutor, PBSInfoWatcher
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.commands import CommandError
from orchestrator.faults.inject import FaultRequest, inject
from orchestrator.render.scripts import attempt_job_name
from orchestrator.states import JobState, from_pbs

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
FakePBS = FakeCommands


@pytest.fixture
def fake_pbs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCommands:
    monkeypatch.setenv(pbs_commands.ENV_SERVER, "slurm-wrappers")
    return install(tmp_path, monkeypatch, ("qsub", "qstat", "qselect", "qdel", "qrerun", "srun", "squeue", "sacct"))


def test_one_qstat_call_for_all_jobs_and_wrapper_elements(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_array_element_running.txt").read_text()
                    + (RECORDED / "pbs_wrappers_qstat_f_running.txt").read_text())
    (tmp_path / SCHEDULER_ID_FILE.format(job="108[0]")).write_text("109\n")
    folders = {"108[0]": tmp_path, "108[1]": tmp_path}
    states = qstat_states(["105", "108[0]", "108[1]", "99"], folders)
    assert states == {"105": JobState.RUNNING, "108[0]": JobState.RUNNING, "108[1]": JobState.PENDING,
                      "99": JobState.UNKNOWN}
    assert fake_pbs.calls == ["qstat -f 105 108 109 99"]


@pytest.mark.parametrize(("server", "options"), [("pro", "-x -t "), ("torque", "-t ")])
def test_qstat_options_follow_the_server(fake_pbs: FakePBS, monkeypatch: pytest.MonkeyPatch, server: str,
                                         options: str) -> None:
    monkeypatch.setenv(pbs_commands.ENV_SERVER, server)
    fake_pbs.answer("qstat", (RECORDED / "pbs_pro_qstat_fxt_array.txt").read_text())
    states = qstat_states(["1030[0].pbs-srv", "1030[2].pbs-srv"], {})
    assert states == {"1030[0].pbs-srv": JobState.COMPLETED, "1030[2].pbs-srv": JobState.PENDING}
    assert fake_pbs.calls == [f"qstat -f {options}1030[0].pbs-srv 1030[2].pbs-srv"]


def test_a_job_killed_at_its_walltime_is_timeout_by_slurms_accounting_under_the_wrappers(
        fake_pbs: FakePBS, tmp_path: Path) -> None:
    """The wrappers' record of a timed-out job says only C, and its batch script was killed before
    it recorded an exit code: sacct (one call) says TIMEOUT. A job whose script recorded its code
    is judged by it, with no sacct call."""
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_timed_out.txt").read_text())
    fake_pbs.answer("sacct", "2501|TIMEOUT\n")
    assert qstat_states(["2501"], {"2501": tmp_path}) == {"2501": JobState.TIMEOUT}
    assert fake_pbs.calls == ["qstat -f 2501", "sacct -X -n -P -o JobID,State -j 2501"]
    (tmp_path / pbs_commands.EXIT_CODE_FILE.format(job="2501")).write_text("3\n")
    assert qstat_states(["2501"], {"2501": tmp_path}) == {"2501": JobState.FAILED}
    assert fake_pbs.calls[2:] == ["qstat -f 2501"]


def test_without_accounting_a_silent_end_stays_a_failure(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_timed_out.txt").read_text())
    fake_pbs.answer("sacct", "", rc=1, stderr="sacct: error: Slurm accounting storage is disabled\n")
    assert qstat_states(["2501"], {"2501": tmp_path}) == {"2501": JobState.FAILED}


@pytest.mark.parametrize(("exit_status", "state"), [
    ("-11", JobState.TIMEOUT), ("-12", JobState.TIMEOUT), ("-10", JobState.OUT_OF_MEMORY),
    ("-29", JobState.TIMEOUT), ("-27", JobState.OUT_OF_MEMORY), ("271", JobState.FAILED), ("0", JobState.COMPLETED),
])
def test_limit_exit_statuses_of_torque_and_pbs_pro(exit_status: str, state: JobState) -> None:
    assert from_pbs("C", exit_status) is state


@pytest.mark.parametrize(("server", "used", "state"), [
    ("torque", "00:20:01", JobState.TIMEOUT), ("torque", "00:19:58", JobState.TIMEOUT),
    ("torque", "00:07:12", JobState.FAILED), ("torque", "00:19:50", JobState.FAILED),  # 10 s short: a qdel's
    ("pro", "00:20:00", JobState.TIMEOUT), ("pro", "00:03:00", JobState.FAILED),
])
def test_a_signal_death_256_plus_n_is_the_walltimes_only_when_the_record_shows_it_spent(
        fake_pbs: FakePBS, monkeypatch: pytest.MonkeyPatch, server: str, used: str, state: JobState) -> None:
    """Real-sites issue, item 10: PBS Pro and Torque give a job a signal ended 256 + N; Torque's MOM
    ends a job at its walltime with SIGTERM on many sites (271, not -11), which was FAILED (a rank
    failure, its node blamed). 271 with the walltime used up is TIMEOUT; a qdel's 271 is not."""
    monkeypatch.setenv(pbs_commands.ENV_SERVER, server)
    record = (RECORDED / "pbs_torque_qstat_f.txt").read_text().split("\n\n")[1]  # job 1346: exit_status = 271
    fake_pbs.answer("qstat", record.replace("    exit_status = 271", f"    resources_used.walltime = {used}\n"
                                                                     "    exit_status = 271"))
    job = "1346.torque-srv.example.com"
    assert qstat_states([job], {}) == {job: state}


def test_a_job_without_its_walltime_used_or_limit_in_the_record_is_not_judged_timed_out() -> None:
    assert not pbs_commands.walltime_spent({"Resource_List.walltime": "00:20:00"})
    assert not pbs_commands.walltime_spent({"resources_used.walltime": "00:20:00", "Resource_List.walltime": "1-00"})
    assert pbs_commands.walltime_spent({"resources_used.walltime": "1201", "Resource_List.walltime": "20:00"})


def test_the_walltime_stays_on_pbs_and_its_end_is_due_within_it(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_timed_out.txt").read_text().replace(
        "job_state = C", "job_state = R"))
    walltime = PBSBackend("d1").set_time_left("2501", 30.0)
    assert walltime.ends_within_s == 60.0 and "walltime kept at 00:01:00" in walltime.said
    assert not any(call.startswith("qalter") for call in fake_pbs.calls)


def test_unknown_ids_are_not_an_error_but_a_failing_qstat_is(fake_pbs: FakePBS) -> None:
    fake_pbs.answer("qstat", "", rc=153)  # the wrappers: none of the ids known
    assert qstat_states(["424242"], {}) == {"424242": JobState.UNKNOWN}
    fake_pbs.answer("qstat", "", rc=153, stderr="qstat: Unknown Job Id 424242.pbs-srv\n")  # PBS Pro
    assert qstat_states(["424242.pbs-srv"], {}) == {"424242.pbs-srv": JobState.UNKNOWN}
    fake_pbs.answer("qstat", "", rc=2, stderr="Unknown option: x\nUsage: qstat [-f] ...\n")
    with pytest.raises(CommandError, match="qstat -f 1"):
        qstat_states(["1"], {})


def test_server_detection(fake_pbs: FakePBS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(pbs_commands.ENV_SERVER)
    qstat = tmp_path / "bin" / "qstat"
    for marker, stdout, kind in [("", "pbs_version = 2022.1.3\n", ServerKind.PRO),
                                 ("", "Version: 6.1.3\nCommit: abc\n", ServerKind.TORQUE),
                                 ("use Slurm ':all';", "", ServerKind.SLURM_WRAPPERS)]:
        qstat.write_text(FAKE.format(marker=marker))
        fake_pbs.answer("qstat", stdout)
        pbs_commands._probe_server.cache_clear()
        assert detect_server() is kind
    pbs_commands._probe_server.cache_clear()


def test_qdel_never_deletes_a_whole_array_for_one_pending_element(fake_pbs: FakePBS, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="whole array"):
        qdel("108[1]", tmp_path)
    (tmp_path / SCHEDULER_ID_FILE.format(job="108[0]")).write_text("109\n")
    qdel("108[0]", tmp_path)
    qdel("105", None)
    assert fake_pbs.calls == ["qdel 109", "qdel 105"]


def test_qrerun_refused_is_an_error_with_its_output(fake_pbs: FakePBS) -> None:
    # slurm-wlm-torque 22.05's qrerun calls Slurm::requeue with too few arguments and exits 2.
    fake_pbs.answer("qrerun", "", rc=2, stderr="Usage: Slurm::requeue(self, job_id, state)\n")
    with pytest.raises(CommandError, match="requeue"):
        qrerun("105", None)


def _square(value: int) -> int:
    return value * value


def test_executor_map_array_is_one_qsub_with_a_pickle_per_element(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qsub", "1030[].pbs-srv\n")
    executor = PBSExecutor(tmp_path / "logs", python="/opt/py/bin/python")
    executor.update_parameters(job_name="square me", timeout_min=7, array_parallelism=2, flavor="pro", mem_gb=2)
    jobs = executor.map_array(_square, [1, 2, 3])
    assert [job.job_id for job in jobs] == ["1030[0].pbs-srv", "1030[1].pbs-srv", "1030[2].pbs-srv"]
    assert all(job.paths.submitted_pickle.exists() for job in jobs)
    [call] = fake_pbs.calls
    assert call.startswith("qsub -o pbs-") and call.endswith(".sh")
    script = (tmp_path / "logs" / "1030[].pbs-srv_submission.sh").read_text()
    for line in ("#PBS -N square_me", "#PBS -J 0-2%2", "#PBS -l select=1:ncpus=1:mpiprocs=1:mem=2048mb",
                 "#PBS -l walltime=00:07:00"):
        assert line in script.splitlines()


def test_executor_single_job_and_parameter_checks(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qsub", "Submitted batch job 77\n77\n")
    executor = PBSExecutor(tmp_path / "%j", python="/opt/py/bin/python")
    executor.update_parameters(nodes=2, tasks_per_node=3, gpus_per_node=1)
    job = executor.submit(_square, 4)
    assert job.job_id == "77" and job.num_tasks == 6
    script = (tmp_path / "77" / "77_submission.sh").read_text()
    assert "#PBS -l nodes=2:ppn=3:gpus=1" in script and "mpiexec -n 6 --map-by ppr:3:node" in script
    with pytest.raises(ValueError, match="unknown PBS parameter"):
        executor.update_parameters(partition="debug")
    with pytest.raises(ValueError, match="flavor"):
        executor.update_parameters(flavor="sge")


def test_watcher_states_and_done(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_finished.txt").read_text())
    (tmp_path / "105_exit_code").write_text("0\n")
    watcher = PBSInfoWatcher(delay_s=1)
    watcher.register_job("105")
    watcher.folders["105"] = tmp_path
    watcher.register_job("104")
    assert watcher.get_state("105", mode="force") == "COMPLETED"
    assert watcher.get_state("104", mode="cache") == "FAILED"
    assert watcher.is_done("105", mode="cache") and watcher.num_calls == 1


def _campaign(workdir: Path) -> Campaign:
    return Campaign.model_validate({
        "name": "unit", "backend": "pbs", "workdir": str(workdir), "parallel_runs": 2,
        "workload": {"framework": "torch", "params": 20000, "steps": 40},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"},
        "sweep": {"grid": {"workload.seed": [1, 2, 3]}},
    })


def _rank_job(run_id: str, run_dir: Path) -> RankJob:
    from experiments.layout import WorkloadSpec

    return RankJob(run_id=run_id, run_dir=str(run_dir), attempt=0, workload=WorkloadSpec(), checkpoint_every=10,
                   checkpoint_keep=2, drill_id="unit-1")


def test_backend_array_of_first_attempts(fake_pbs: FakePBS, tmp_path: Path) -> None:
    fake_pbs.answer("qsub", "88\n")
    runs = expand_runs(_campaign(tmp_path / "work"))
    backend = PBSBackend("unit-1", python="/opt/py/bin/python")
    submissions = backend.submit_array([(run, _rank_job(run.run_id, run.paths.root)) for run in runs])
    assert [s.job_id for s in submissions] == ["88[0]", "88[1]", "88[2]"]
    for run, submission in zip(runs, submissions, strict=False):
        assert (run.paths.submitit / f"{submission.job_id}_submitted.pkl").exists()
    script = (tmp_path / "work" / "arrays" / "88_submission.sh").read_text()
    assert "#PBS -t 0-2%2" in script and script.count("experiments.task") == 1
    fake_pbs.answer("qstat", (RECORDED / "pbs_wrappers_qstat_f_array_element_running.txt").read_text()
                    .replace("108", "88").replace("109", "89"))
    (runs[0].paths.submitit / SCHEDULER_ID_FILE.format(job="88[0]")).write_text("89\n")
    assert backend.poll(["88[0]", "88[1]"]) == {"88[0]": JobState.RUNNING, "88[1]": JobState.PENDING}
    with pytest.raises(CommandError, match="whole array"):  # pending under the wrappers: refused
        backend.cancel("88[1]")
    assert not any(call.startswith("qdel") for call in fake_pbs.calls)


def test_backend_finds_an_unrecorded_submission_by_name(fake_pbs: FakePBS, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = expand_runs(_campaign(tmp_path / "work"))[0]
    name = attempt_job_name(run, 0, "unit-1")
    monkeypatch.setenv(pbs_commands.ENV_SERVER, "torque")
    monkeypatch.setattr(pbs_backend, "current_user", lambda: "alice")  # the recording's user
    # The server selects by name and owner (qselect), not a qstat -f of every job it holds (with PBS
    # Pro's -x: its whole history; real-sites issue, item 10). Its answer, as Torque prints it:
    fake_pbs.answer("qselect", "1347.torque-srv.example.com\n")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 0, name, None, 0.0)) == ["1347.torque-srv.example.com"]
    assert fake_pbs.calls[-1] == f"qselect -u alice -N {name}"
    fake_pbs.answer("qselect", "")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 1, attempt_job_name(run, 1, "unit-1"), None, 0.0)) == []
    # An attempt that went out as element 2 of an array: the array is found by its name. Torque's
    # qselect lists an array's elements, never the array itself (its server walks real jobs only).
    fake_pbs.answer("qselect", "1347[0].torque-srv.example.com\n1347[1].torque-srv.example.com\n")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 0, name, 2, 0.0)) == ["1347[2].torque-srv.example.com"]
    # PBS Pro keeps finished jobs apart: -x selects them too.
    monkeypatch.setenv(pbs_commands.ENV_SERVER, "pro")
    fake_pbs.answer("qselect", "1025.pbs-srv\n")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 0, name, None, 0.0)) == ["1025.pbs-srv"]
    assert fake_pbs.calls[-1] == f"qselect -u alice -N {name} -x"
    # A PBS Pro server without job history refuses -x (and exits 0, saying so): asked again without.
    fake_pbs.answer("qselect", "", stderr="qselect: job_history_enable is not set on the server\n")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 0, name, None, 0.0)) == []
    assert fake_pbs.calls[-2:] == [f"qselect -u alice -N {name} -x", f"qselect -u alice -N {name}"]
    # Under Slurm's wrappers the started elements of an array are listed under Slurm ids of their
    # own (with the array's name): the array is what Slurm calls the array.
    monkeypatch.setenv(pbs_commands.ENV_SERVER, "slurm-wrappers")
    fake_pbs.answer("squeue", "108\n108\n108\n")
    assert PBSBackend("unit-1").find_submitted(AttemptRef(run, 0, name, 1, 0.0)) == ["108[1]"]
    assert fake_pbs.calls[-1] == f"squeue -h -t all -u alice -n {name} -o %F"


def test_fault_agent_reaches_the_node_by_srun_under_the_wrappers_else_ssh(
    fake_pbs: FakePBS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = PBSBackend("unit-1", python="/opt/py/bin/python")
    agent = ["/opt/py/bin/python", "-m", "injectors.agent", "kill-rank", "--run-dir", "/w/it's"]
    assert backend._on_node("105", "fd-n2", agent)[:10] == [
        "srun", "--jobid=105", "--job-name=faultdrill-agent", "--overlap", "--mem=0", "--gres=none", "--nodes=1",
        "--ntasks=1", "--nodelist=fd-n2", "--quiet"]
    monkeypatch.setenv(pbs_commands.ENV_SERVER, "pro")
    remote = "/opt/py/bin/python -m injectors.agent kill-rank --run-dir '/w/it'\"'\"'s'"
    assert backend._on_node("1025.pbs-srv", "node01", agent) == ["ssh", "-o", "BatchMode=yes", "node01", remote]
    monkeypatch.setenv("FAULTDRILL_PBS_AGENT_LAUNCH", "telepathy")
    with pytest.raises(ValueError, match="telepathy"):
        backend._on_node("1025.pbs-srv", "node01", agent)


def test_kill_rank_reports_the_agents_verdict(fake_pbs: FakePBS, tmp_path: Path) -> None:
    run = expand_runs(_campaign(tmp_path / "work"))[0]
    identity = run.paths.rank_file(0, 0)
    identity.parent.mkdir(parents=True)
    identity.write_text('{"rank": 0, "pid": 1, "create_time": 0, "host": "fd-n1", "node": "fd-n1", '
                        '"job_id": "105", "attempt": 0}')
    fake_pbs.answer("srun", '{"ok": true, "kind": "kill-rank", "target": "rank 0@fd-n1", "pid": 4242, "node": "fd-n1", '
                            '"signal": "SIGKILL", "at": 12.5, "detail": ""}\n')
    fault = PlannedFault(index=0, kind="kill-rank", delay_s=0.0, anchor="training_start", ranks=(0,),
                         options={"signal": "SIGKILL"})
    outcome = inject(PBSBackend("unit-1"), FaultRequest(run=run, attempt=0, job_id="105", fault=fault))
    assert (outcome.pid, outcome.node, outcome.at) == (4242, "fd-n1", 12.5)
    assert fake_pbs.calls[0].startswith("srun --jobid=105 --job-name=faultdrill-agent --overlap --mem=0 --gres=none "
                                        "--nodes=1 --ntasks=1 --nodelist=fd-n1 --quiet ")
