"""qstat -f / qsub output parsing on recorded outputs (the local Torque wrappers verbatim; Torque
and PBS Pro in their documented formats), and the one PBS state table."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.pbs.commands import (
    EXIT_CODE_FILE,
    SCHEDULER_ID_FILE,
    ServerKind,
    array_element_id,
    parse_qstat_full,
    parse_qsub,
    record_state,
    scheduler_target,
    short_id,
)
from orchestrator.commands import CommandError
from orchestrator.states import PBS_STATES, JobState, from_pbs

RECORDED = Path(__file__).resolve().parents[1] / "recorded"


def _records(name: str) -> dict[str, dict[str, str]]:
    return parse_qstat_full((RECORDED / name).read_text())


def _states(name: str, folder: Path | None = None) -> dict[str, JobState]:
    return {job_id: record_state(job_id, record, folder) for job_id, record in _records(name).items()}


def test_wrapper_output_running_and_queued() -> None:
    records = _records("pbs_wrappers_qstat_f_running.txt")
    assert list(records) == ["105", "104"]
    assert records["105"]["Job_Name"] == "fd-rec-one"
    assert records["105"]["exec_host"] == "fd-n1/3+fd-n2/1"
    assert _states("pbs_wrappers_qstat_f_running.txt") == {"105": JobState.RUNNING, "104": JobState.PENDING}


def test_wrapper_finished_jobs_need_the_recorded_exit_code(tmp_path: Path) -> None:
    # The wrappers print C with no exit status, for success and failure alike (104 exited 3).
    assert set(_states("pbs_wrappers_qstat_f_finished.txt").values()) == {JobState.FAILED}
    (tmp_path / EXIT_CODE_FILE.format(job="105")).write_text("0\n")
    (tmp_path / EXIT_CODE_FILE.format(job="104")).write_text("3\n")
    states = _states("pbs_wrappers_qstat_f_finished.txt", tmp_path)
    assert states["105"] is JobState.COMPLETED
    assert states["104"] is JobState.FAILED
    assert states["106"] is JobState.FAILED  # no record of its exit: never a success


def test_wrapper_array_element_is_found_under_its_recorded_id(tmp_path: Path) -> None:
    records = _records("pbs_wrappers_qstat_f_array_element_running.txt")
    assert {job_id: record["job_state"] for job_id, record in records.items()} == {"109": "R", "108": "Q"}
    (tmp_path / SCHEDULER_ID_FILE.format(job="108[0]")).write_text("109\n")
    wrappers = ServerKind.SLURM_WRAPPERS
    assert scheduler_target("108[0]", tmp_path, wrappers).scheduler_id == "109"
    pending = scheduler_target("108[1]", tmp_path, wrappers)
    assert pending.scheduler_id == "108" and pending.array_only
    assert scheduler_target("108[1]", tmp_path, ServerKind.TORQUE).scheduler_id == "108[1]"


def test_torque_output_with_exit_status_and_wrapped_values() -> None:
    records = _records("pbs_torque_qstat_f.txt")
    assert records["1345.torque-srv.example.com"]["Variable_List"].endswith(
        "PBS_O_HOST=login1.example.com,PBS_O_SERVER=torque-srv.example.com")
    assert "PBS_O_SHELL=/bin/bash,PBS_O_LANG" in records["1345.torque-srv.example.com"]["Variable_List"]
    assert [state.value for state in _states("pbs_torque_qstat_f.txt").values()] == [
        "COMPLETED", "FAILED", "RUNNING", "PENDING", "PENDING"]  # exit 0, killed (271), R, Q, held


def test_torque_array_subjobs() -> None:
    states = _states("pbs_torque_qstat_f_t_array.txt")
    assert states == {
        "1350[0].torque-srv.example.com": JobState.COMPLETED,
        "1350[1].torque-srv.example.com": JobState.RUNNING,
        "1350[2].torque-srv.example.com": JobState.PENDING,
    }
    assert array_element_id("1350[].torque-srv.example.com", 1) in states


def test_pro_output_finished_history_and_limits() -> None:
    records = _records("pbs_pro_qstat_fx.txt")
    variables = records["1025.pbs-srv"]["Variable_List"]
    assert "PBS_O_LOGNAME=alice," in variables and "PBS_O_SHELL=/bin/bash," in variables
    assert records["1025.pbs-srv"]["Submit_arguments"].endswith(".submission_file_3f2a.sh")
    assert records["1029.pbs-srv"]["comment"].startswith("Not Running: Insufficient amount")
    assert _states("pbs_pro_qstat_fx.txt") == {
        "1025.pbs-srv": JobState.COMPLETED, "1026.pbs-srv": JobState.TIMEOUT, "1027.pbs-srv": JobState.RUNNING,
        "1028.pbs-srv": JobState.COMPLETING, "1029.pbs-srv": JobState.PENDING,
    }


def test_pro_array_parent_and_subjobs() -> None:
    states = _states("pbs_pro_qstat_fxt_array.txt")
    assert states == {
        "1030[].pbs-srv": JobState.RUNNING,  # B: begun
        "1030[0].pbs-srv": JobState.COMPLETED,  # X with Exit_status 0
        "1030[1].pbs-srv": JobState.RUNNING,
        "1030[2].pbs-srv": JobState.PENDING,
    }
    assert short_id("1030[2].pbs-srv") == "1030[2]"


def test_every_documented_letter_has_a_state() -> None:
    assert set(PBS_STATES) == set("QWHTRBESCFX")
    assert from_pbs("U") is JobState.UNKNOWN and from_pbs("M") is JobState.UNKNOWN and from_pbs("") is JobState.UNKNOWN
    assert from_pbs("F", "0") is JobState.COMPLETED
    assert from_pbs("F", None) is JobState.FAILED
    assert from_pbs("C", "-27") is JobState.OUT_OF_MEMORY
    assert from_pbs("X", 265) is JobState.FAILED
    assert from_pbs("r") is JobState.RUNNING


def test_missing_record_is_unknown_never_a_success() -> None:
    assert record_state("77", None, None) is JobState.UNKNOWN


@pytest.mark.parametrize(("stdout", "job_id"), [
    ("104\n", "104"),  # the wrappers
    ("1025.pbs-srv\n", "1025.pbs-srv"),
    ("1030[].pbs-srv\n", "1030[].pbs-srv"),
    ("1350[].torque-srv.example.com\n", "1350[].torque-srv.example.com"),
])
def test_qsub_output(stdout: str, job_id: str) -> None:
    assert parse_qsub(stdout) == job_id


def test_qsub_output_without_an_id_is_an_error() -> None:
    with pytest.raises(CommandError, match="no job id"):
        parse_qsub("There was an error running the Slurm sbatch command.\n")


def test_array_element_ids() -> None:
    assert array_element_id("69", 4) == "69[4]"
    assert array_element_id("1030[].pbs-srv", 0) == "1030[0].pbs-srv"


def test_a_long_value_that_wraps_into_an_owner_line_is_not_the_jobs_owner() -> None:
    """Issue 28's review, item 3: a stranger's job whose long value wraps so that a continuation
    reads `Job_Owner = <you>@...` was taken for the user's (the owner filter of the look-up by name)."""
    stranger = ("Job Id: 77.pbs\n"
                "    Job_Name = fd-drill-r000-a0\n"
                "    Job_Owner = mallory@login1\n"
                "    Variable_List = PBS_O_HOME=/home/mallory,PBS_O_LOGNAME=mallory,\n"
                "\tJob_Owner = alice@login1\n"
                "    job_state = R\n")
    [(job, record)] = parse_qstat_full(stranger).items()
    assert job == "77.pbs" and record["Job_Owner"] == "mallory@login1"
    assert record["Variable_List"].endswith("Job_Owner = alice@login1")  # part of the value it wraps
