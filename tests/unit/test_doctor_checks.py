"""``faultdrill doctor``'s judgements (real-sites issue): the clock offset from timed exchanges (the
quickest one's, within half its round trip), a node whose clock is off, whose framework does not
import or that wrote nothing, files the login node saw late, and a workdir on a network filesystem.
The node facts and mount tables as they come (recorded); the cluster test runs the real thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.runtime.mounts import filesystem_type
from orchestrator.doctor.checks import Status
from orchestrator.doctor.filesystems import check_directory
from orchestrator.doctor.nodes import node_checks
from orchestrator.doctor.probe_job import NodeReport
from orchestrator.record.clocks import ClockReading, Exchange, offset_of

pytestmark = pytest.mark.unit

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 filer:/export/home rw,vers=4.2
41 22 0:36 / /scratch rw,relatime shared:21 - lustre 10.0.0.1@o2ib:/scratch rw,flock
42 41 0:37 / /scratch/local\\040disk rw - xfs /dev/sdb1 rw
"""


def test_the_offset_is_the_quickest_exchanges_within_half_its_round_trip() -> None:
    # A node 0.8 s ahead; the exchanges' round trips 40, 2 and 10 ms (the answer late in the slow ones).
    exchanges = [Exchange(100.000, 100.835, 100.040), Exchange(101.000, 101.801, 101.002),
                 Exchange(102.000, 102.809, 102.010)]
    reading = offset_of(exchanges)
    assert reading.offset_s == pytest.approx(0.8, abs=1e-9) and reading.uncertainty_s == pytest.approx(0.001)
    assert reading.exchanges == 3
    with pytest.raises(ValueError):
        offset_of([])


def _node(name: str, offset: float = 0.0, facts: dict | None = None, seen_after: float = 0.01) -> NodeReport:
    written = 1000.0
    found = {"node": name, "python": "/opt/py/bin/python", "python_version": "3.11.7", "written_at": written,
             "framework": "torch", "framework_version": "2.4.0", "memory_cap": None, **(facts or {})}
    # seen on the login node's clock: the node's write (its clock minus its offset) plus the delay
    return NodeReport(name, found, written - offset + seen_after, ClockReading(offset, 0.0005, 16))


def _status(reports: list[NodeReport], name: str) -> tuple[Status, str]:
    [check] = [check for check in node_checks(reports, "torch") if check.name == name]
    return check.status, check.detail


def test_a_node_whose_clock_is_off_is_a_warning_that_names_it() -> None:
    status, detail = _status([_node("n1", 0.0003), _node("n2", -0.8)], "clocks")
    assert status is Status.WARN and "n2" in detail and "n1" not in detail.split("(")[0], detail
    assert _status([_node("n1", 0.0003), _node("n2", 0.02)], "clocks")[0] is Status.PASS


def test_a_framework_that_does_not_import_on_a_node_fails() -> None:
    broken = _node("n2", facts={"framework_error": "ModuleNotFoundError: No module named 'torch'"})
    status, detail = _status([_node("n1"), broken], "nodes: framework")
    assert status is Status.FAIL and "n2: ModuleNotFoundError" in detail


def test_a_node_that_wrote_nothing_fails_with_its_jobs_words() -> None:
    silent = NodeReport("n2", None, None, None, "no facts from n2 within 90 s (its output: execve(): python: No such file)")
    status, detail = _status([_node("n1"), silent], "nodes: python")
    assert status is Status.FAIL and "No such file" in detail


def test_files_the_login_node_saw_late_are_a_warning_with_the_delay_on_its_own_clock() -> None:
    status, detail = _status([_node("n1", offset=0.5, seen_after=2.5)], "shared filesystem")
    assert status is Status.WARN and "n1 2.50 s" in detail, detail  # the node's 0.5 s offset taken out
    assert _status([_node("n1", offset=0.5, seen_after=0.2)], "shared filesystem")[0] is Status.PASS


def test_the_filesystem_of_a_path_is_its_longest_mount_points() -> None:
    assert filesystem_type(Path("/home/alice/drill"), MOUNTINFO) == "nfs4"
    assert filesystem_type(Path("/scratch/alice"), MOUNTINFO) == "lustre"
    assert filesystem_type(Path("/scratch/local disk/x"), MOUNTINFO) == "xfs"
    assert filesystem_type(Path("/var/tmp"), MOUNTINFO) == "ext4"


def test_a_local_workdir_passes_flock_rename_and_type(tmp_path: Path) -> None:
    checks = check_directory("workdir", tmp_path / "work")
    assert [check.status for check in checks] == [Status.PASS] * 3, checks
    assert not [path for path in (tmp_path / "work").iterdir()], "the doctor's probe files are removed"


def test_a_ledger_dir_on_local_disk_passes_and_one_on_a_network_filesystem_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.doctor import filesystems

    local = filesystems.check_ledger_directory(tmp_path / "ledgers")
    assert [check.status for check in local] == [Status.PASS] * 3, local
    monkeypatch.setattr(filesystems, "filesystem_type", lambda _path: "nfs4")
    remote = {check.name: check for check in filesystems.check_ledger_directory(tmp_path / "ledgers")}
    assert remote["ledger_dir: filesystem"].status is Status.FAIL, remote
    assert "nfs4" in remote["ledger_dir: filesystem"].detail and "local disk" in remote["ledger_dir: filesystem"].fix
    assert remote["ledger_dir: flock"].status is Status.PASS


def test_an_sacct_that_does_not_answer_is_a_warning_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmdbd configured but unreachable: sacct hangs past the doctor's timeout, which the command
    wrapper raises as a CommandError even with check=False (review of issue 22)."""
    from orchestrator.commands import CommandError
    from orchestrator.doctor import slurm as doctor_slurm

    def hangs(args: list[str], timeout_s: float, check: bool) -> None:
        raise CommandError(args, None, "", "", f"command timed out after {timeout_s:g} s")

    monkeypatch.setattr(doctor_slurm, "run_command", hangs)
    check = doctor_slurm._accounting("AccountingStorageType   = accounting_storage/slurmdbd\n")
    assert check.status is Status.WARN and "did not answer" in check.detail and "timed out" in check.detail, check


def test_disk_full_is_checked_on_the_checkpoint_directorys_filesystem_not_the_workdirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """disk-full fills the checkpoint directory's filesystem: the doctor asks of that one (review of
    issue 22: it read the workdir's, and its fix said to raise max_fill_mb)."""
    from injectors.kinds import disk_full
    from orchestrator.doctor.nodes import kind_checks

    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    big.mkdir()
    monkeypatch.setattr(disk_full, "_free_bytes", lambda path: (64 if path == small else 80_000) * disk_full.MB)
    by_name = {check.name: check for check in kind_checks("local", [], small)}
    assert by_name["fault kinds: disk-full"].status is Status.PASS, by_name
    by_name = {check.name: check for check in kind_checks("local", [], big / "not-yet" / "deeper")}
    said = by_name["fault kinds: disk-full"]
    assert said.status is Status.WARN and str(big) in said.detail and "80000 MB free" in said.detail, said
    assert "checkpoint.directory" in said.fix and "raise max_fill_mb" not in said.fix, said
    # the spec's own max_fill_mb (second review): a disk-full that may fill 81920 MB can fill it
    roomy = {check.name: check for check in kind_checks("local", [], big, max_fill_mb=81920.0)}
    assert roomy["fault kinds: disk-full"].status is Status.PASS, roomy["fault kinds: disk-full"]


def test_the_test_jobs_script_asks_what_the_spec_asks_and_escapes_its_output_path(tmp_path: Path) -> None:
    from orchestrator.doctor.probe_job import SlurmProbe

    script = SlurmProbe(tmp_path / "50%", 2, "debug", "torch", ("--account=ml", "--qos=short")).script()
    assert "#SBATCH --account=ml" in script and "#SBATCH --qos=short" in script and "#SBATCH -N 2" in script
    assert "50%%" in script.split("#SBATCH -o ", 1)[1].splitlines()[0], "a % in the path is no Slurm pattern"


# --- the doctor on PBS: the server's answers as they come (recorded from the manuals' formats) ----

PRO_SERVER = """\
Server pbs01
    server_state = Active
    scheduling = True
    job_history_enable = True
    job_history_duration = 336:00:00
"""
PRO_SERVER_NO_HISTORY = "Server pbs01\n    server_state = Active\n    scheduling = True\n"
TORQUE_SERVER = "Server torque01\n\tserver_state = Active\n\tkeep_completed = 300\n\tscheduling = True\n"


@pytest.mark.parametrize(("server", "attributes", "status"), [
    ("pro", PRO_SERVER, Status.PASS), ("pro", PRO_SERVER_NO_HISTORY, Status.WARN),
    ("torque", TORQUE_SERVER, Status.PASS), ("torque", TORQUE_SERVER.replace("300", "0"), Status.WARN),
    ("pro", None, Status.WARN),
])
def test_pbs_job_history_is_read_from_the_servers_attributes(server: str, attributes: str | None,
                                                             status: Status) -> None:
    """Issue 22, the doctor on PBS (item 10): a server that forgets finished jobs is a warning that
    says what the drill then knows less of (a walltime's end), and what a manager can set."""
    from orchestrator.backends.pbs.commands import ServerKind
    from orchestrator.doctor.pbs import history_check

    check = history_check(ServerKind(server), attributes)
    assert check.status is status, check
    if status is Status.WARN:
        assert "TIMEOUT is lost" in check.fix, check


@pytest.mark.parametrize(("version", "status", "said"), [
    ("mpiexec (OpenRTE) 4.1.4", Status.PASS, "Open MPI 4.1"),
    ("mpiexec (Open MPI) 5.0.3", Status.PASS, "PRRTE"),
    ("mpiexec (OpenRTE) 3.1.6", Status.WARN, "older than"),
    ("HYDRA build details:", Status.FAIL, "MPICH or Intel MPI"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.6 Build 20220227 (id: 28877f3f32)", Status.FAIL, "Open MPI"),
    (None, Status.FAIL, "no mpiexec"),
])
def test_the_mpiexec_that_starts_pbs_ranks_is_open_mpi_4_or_5(version: str | None, status: Status, said: str) -> None:
    """Review of issue 22 (the PBS doctor): each Open MPI release gets its own advice (3.x is not
    told Open MPI 5's, nor is a spec on PBS told workload.mpi venv, which PBS refuses); Hydra's
    mpiexec (MPICH, Intel MPI) takes none of the batch script's Open MPI options: a failure."""
    from orchestrator.doctor.pbs import mpiexec_check

    check = mpiexec_check(version)
    assert check.status is status and said in check.detail + check.fix, check
    assert "workload.mpi: venv" not in check.fix, "PBS refuses workload.mpi venv"


PRO_SERVER_STATUS = "Server: pbs01\n    server_state = Active\n    server_host = pbs01\n    pbs_version = 2022.1.1\n"
TORQUE_SERVER_STATUS = "Server: torque01\n    server_state = Active\n    pbs_version = 6.1.3\n"


@pytest.mark.parametrize(("server", "status_text", "version"), [
    ("pro", PRO_SERVER_STATUS, "2022.1.1"), ("torque", TORQUE_SERVER_STATUS, "6.1.3")])
def test_the_pbs_scheduler_check_asks_the_server_and_says_its_version(
        monkeypatch: pytest.MonkeyPatch, server: str, status_text: str, version: str) -> None:
    """Review of issue 22 (the PBS doctor): the server is contacted (qstat -B -f), its release said;
    a server that does not answer is a failed check with its words."""
    import orchestrator.backends.pbs.server as server_attributes
    import orchestrator.doctor.pbs as pbs
    from experiments.layout import ENV_PBS_SERVER
    from orchestrator.commands import CommandError, CommandResult

    monkeypatch.setenv(ENV_PBS_SERVER, server)
    monkeypatch.setattr(pbs.shutil, "which", lambda name: f"/usr/bin/{name}")
    answers = {"-B": CommandResult(("qstat",), 0, status_text, "", 0.01)}

    def run(args: list[str], **_: object) -> CommandResult:
        if args[0] == "qstat" and "-B" in args:
            answer = answers["-B"]
            if answer.returncode:
                raise CommandError(args, answer.returncode, "", answer.stderr, "qstat failed")
            return answer
        return CommandResult(tuple(args), 0, "mpiexec (OpenRTE) 4.1.4" if args[0] == "mpiexec" else "", "", 0.01)

    monkeypatch.setattr(pbs, "run_command", run)
    monkeypatch.setattr(server_attributes, "run_command", run)  # qmgr: its attributes
    [scheduler, *_] = pbs.scheduler_checks()
    assert scheduler.status is Status.PASS and version in scheduler.detail, scheduler
    answers["-B"] = CommandResult(("qstat",), 1, "", "Connection refused\nqstat: cannot connect to server pbs01", 0.01)
    [scheduler, *_] = pbs.scheduler_checks()
    assert scheduler.status is Status.FAIL and "cannot connect to server" in scheduler.detail, scheduler


def test_a_failing_qstat_version_is_an_error_not_torque(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Review of issue 22 (the PBS doctor): which server answers is not guessed from a failure."""
    import orchestrator.backends.pbs.commands as commands
    from orchestrator.commands import CommandError, CommandResult

    qstat = tmp_path / "qstat"
    qstat.write_bytes(b"\x7fELF")
    monkeypatch.delenv("FAULTDRILL_PBS_SERVER", raising=False)
    monkeypatch.setattr(commands.shutil, "which", lambda name: str(qstat))
    answers = iter([CommandResult(("qstat",), 127, "", "qstat: error while loading shared libraries: libtorque.so.2",
                                  0.01), CommandResult(("qstat",), 0, "", "Version: 6.1.3\nCommit: 1a2b3c\n", 0.01)])
    monkeypatch.setattr(commands, "run_command", lambda args, **_: next(answers))
    commands._probe_server.cache_clear()
    try:
        with pytest.raises(CommandError, match="libtorque"):
            commands.detect_server()
        assert commands.detect_server() is commands.ServerKind.TORQUE
    finally:
        commands._probe_server.cache_clear()


TORQUE_QUEUE_KEEPS = "Queue batch\n\tqueue_type = Execution\n\tkeep_completed = 300\n\tenabled = True\n"


def test_torques_keep_completed_may_be_the_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 22 (the PBS doctor): keep_completed set on the job's queue keeps its finished
    jobs as the server's would; asked of the queue the spec names, else the server's default_queue."""
    from orchestrator.backends.pbs.commands import ServerKind
    from orchestrator.doctor.pbs import history_check, job_queue

    server = TORQUE_SERVER.replace("\tkeep_completed = 300\n", "\tdefault_queue = batch\n")
    assert job_queue(None, server) == "batch" and job_queue("gpu", server) == "gpu"
    check = history_check(ServerKind.TORQUE, server, "batch", TORQUE_QUEUE_KEEPS)
    assert check.status is Status.PASS and "queue batch" in check.detail, check
    assert history_check(ServerKind.TORQUE, server, "batch", "Queue batch\n\tenabled = True\n").status is Status.WARN


@pytest.mark.parametrize(("server", "resources"), [
    ("pro", ["#PBS -l select=2:ncpus=1:mpiprocs=1", "#PBS -l place=scatter"]),
    ("torque", ["#PBS -l nodes=2:ppn=1"]), ("slurm-wrappers", ["#PBS -l nodes=2:ppn=1"]),
])
def test_the_pbs_test_job_asks_one_chunk_a_node_and_starts_one_task_on_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, resources: list[str]) -> None:
    from experiments.layout import ENV_PBS_SERVER
    from orchestrator.doctor.probe_job import PBSProbe

    monkeypatch.setenv(ENV_PBS_SERVER, server)
    script = PBSProbe(tmp_path, 2, "debug", "torch", extra_directives=("-A proj1",)).script()
    lines = script.splitlines()
    assert all(line in lines for line in [*resources, "#PBS -q debug", "#PBS -A proj1", "#PBS -o job.out"]), script
    first = next(index for index, line in enumerate(lines) if line.startswith("mpiexec"))
    last = next(index for index in range(first, len(lines)) if not lines[index].endswith("\\"))
    launch = " ".join(line.rstrip("\\").strip() for line in lines[first:last + 1])
    assert launch.startswith("mpiexec -n 2 --map-by ppr:1:node") and "-x PYTHONPATH" in launch, launch
    assert "injectors.probe facts --out-dir" in launch and "--framework torch" in launch, launch
    assert lines[last + 1].startswith("while [ ! -e"), "the job holds its nodes until the doctor is done with them"
    assert "unmark" not in script, "no checkpoint directory: nothing to remove on the nodes"


@pytest.mark.parametrize("backend", ["slurm", "pbs"])
def test_the_test_jobs_last_step_removes_each_nodes_file_in_the_checkpoint_directory(
        tmp_path: Path, monkeypatch, backend: str) -> None:
    """A checkpoint directory private to a node is seen by nobody else to clean: after the hold,
    each node removes its own file of this doctor run (by the run's token)."""
    from experiments.layout import ENV_PBS_SERVER
    from orchestrator.doctor.marks import CheckpointMarks
    from orchestrator.doctor.probe_job import PBSProbe, SlurmProbe

    monkeypatch.setenv(ENV_PBS_SERVER, "torque")
    marks = CheckpointMarks(tmp_path / "scratch")
    probe = (SlurmProbe if backend == "slurm" else PBSProbe)(tmp_path, 2, "debug", None, marks=marks)
    lines = probe.script().splitlines()
    hold = next(index for index, line in enumerate(lines) if line.startswith("while [ ! -e"))
    after = " ".join(lines[hold + 1:])
    assert f"injectors.probe unmark --checkpoints {tmp_path / 'scratch'} --mark {marks.token}" in after, lines
    assert ("srun --ntasks-per-node=1" if backend == "slurm" else "mpiexec -n 2 --map-by ppr:1:node") in after


def test_a_checkpoint_directory_some_node_does_not_share_fails_naming_the_node(tmp_path: Path) -> None:
    """Issue 22, the doctor: checkpoint.directory must be one filesystem for the login node and every
    compute node. A node whose /tmp is its own sees no login file there, and the login node none of
    its files; one that cannot write there says why."""
    from orchestrator.doctor.marks import CheckpointMarks
    from orchestrator.doctor.nodes import checkpoint_checks

    def node(name: str, **said: object) -> NodeReport:
        return NodeReport(name, {"node": name, "written_at": 1.0, "checkpoints": said}, 2.0, None)

    marks = CheckpointMarks(tmp_path)
    marks.node_file("n1").write_text("1")
    [good] = checkpoint_checks(marks, [node("n1", sees_login_file=True, wrote=True)])
    assert good.status is Status.PASS, good
    [bad] = checkpoint_checks(marks, [node("n1", sees_login_file=True, wrote=True),
                                         node("n2", sees_login_file=False, wrote=True),
                                         node("n3", sees_login_file=True, wrote=False, error="Permission denied")])
    assert bad.status is Status.FAIL and "same path" in bad.fix, bad
    assert "n2 does not see the login node's file" in bad.detail and "login node does not see n2's file" in bad.detail
    assert "n3 cannot write there (Permission denied)" in bad.detail and "n1" not in bad.detail, bad


@pytest.mark.parametrize("facts, status, said", [
    ([{"node": "n1", "memory_cap": "not root", "job_memory_limit_mb": 700.0},
      {"node": "n2", "memory_cap": "not root", "job_memory_limit_mb": 1024.0}], Status.PASS, "limits the test job's memory (700 MB)"),
    ([{"node": "n1", "memory_cap": "not root: oom-rank creates a memory cgroup", "job_memory_limit_mb": None}],
     Status.WARN, "n1: not root"),
    ([{"node": "n1", "memory_cap": None, "job_memory_limit_mb": None}], Status.PASS, "can be capped (root"),
    ([], Status.WARN, "no node"),
])
def test_oom_rank_acts_where_the_scheduler_limits_the_jobs_memory_or_as_root(facts, status, said) -> None:
    """Issue 22 item 4 in the doctor: under Slurm's task/cgroup (the probe read its job's memory
    limit on every node) oom-rank acts as any user; else only where a cgroup of its own can be made."""
    from orchestrator.doctor.nodes import _oom_rank_check
    check = _oom_rank_check(facts)
    assert check.status is status and said in check.detail, check
