"""``faultdrill doctor``'s test job as it meets a scheduler (review of issue 22): every node it asked
for is reported, the ones that never answered as failures (PBS names its nodes in ``qstat -f``:
exec_host, exec_vnode); a node's facts are matched to the scheduler's name for it (a host name that
is an FQDN); how late the login node saw a node's file does not include the doctor's own polling;
a PBS job gone from qstat is said ended at once, with its output. qstat's answers as recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import orchestrator.doctor.probe_job as probe_job
from orchestrator.commands import CommandError, CommandResult
from orchestrator.doctor.checks import Status
from orchestrator.doctor.marks import CheckpointMarks
from orchestrator.doctor.nodes import checkpoint_checks, node_checks
from orchestrator.doctor.probe_job import NodeReport, PBSProbe, SlurmProbe
from orchestrator.record.clocks import ClockReading

pytestmark = pytest.mark.unit
RECORDED = Path(__file__).resolve().parents[1] / "recorded"


def _facts(node: str, **more: Any) -> dict[str, Any]:
    return {"node": node, "python": "/usr/bin/python3", "python_version": "3.11.7", "written_at": time.time(),
            "checkpoints": {"sees_login_file": True, "wrote": True}, **more}


def _write(folder: Path, name: str, facts: dict[str, Any]) -> None:
    (folder / f"facts-{name}.json").write_text(json.dumps(facts))


class _Clock:
    def __enter__(self) -> "_Clock":
        return self

    def __exit__(self, *_: object) -> None:
        return None


def _fake_job(monkeypatch: pytest.MonkeyPatch, kind: type, states: list[tuple[str, list[str]]],
              on_poll: Any = None) -> list[str]:
    """The job's submission, its states in turn (the last one repeated) and its clock conversations
    as a recorded scheduler would answer; what was cancelled is returned."""
    cancelled: list[str] = []
    polls = iter(states)

    def state(probe: Any) -> tuple[str, list[str]]:
        said = next(polls, states[-1])
        if on_poll is not None:
            on_poll(said)
        return said

    monkeypatch.setattr(kind, "_submit", lambda probe: "17")
    monkeypatch.setattr(kind, "_state", state)
    monkeypatch.setattr(kind, "_cancel", lambda probe, job_id: cancelled.append(job_id))
    monkeypatch.setattr(kind, "_on_node", lambda probe, host, argv: _Clock())
    monkeypatch.setattr(probe_job, "read_offset", lambda conversation: ClockReading(0.0, 0.001, 8))
    monkeypatch.setattr(probe_job, "FACTS_TIMEOUT_S", 0.5)
    return cancelled


@pytest.mark.parametrize(("record", "hosts"), [
    ("pbs_pro_qstat_fx.txt", ["node03", "node04"]),          # PBS Pro: exec_host node03/0*2+node04/0*2
    ("pbs_wrappers_qstat_f_running.txt", ["fd-n1", "fd-n2"]),  # the wrappers: fd-n1/3+fd-n2/1
])
def test_a_running_pbs_job_names_its_nodes_from_qstat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       record: str, hosts: list[str]) -> None:
    import orchestrator.backends.pbs.commands as commands

    text = (RECORDED / record).read_text()
    job_id = "1027.pbs-srv" if "pro" in record else "105"
    monkeypatch.setenv("FAULTDRILL_PBS_SERVER", "pro" if "pro" in record else "slurm-wrappers")
    monkeypatch.setattr(commands, "run_command",
                        lambda args, **_: CommandResult(tuple(args), 0, text, "", 0.01))
    probe = PBSProbe(tmp_path, 2, None, None)
    probe.job_id = job_id
    assert probe._state() == ("running", hosts)


@pytest.mark.parametrize(("record", "hosts"), [
    ({"exec_host": "node01/0-1+node02/0-1"}, ["node01", "node02"]),                       # Torque
    ({"exec_host": "node03/0*2+node04/0*2+node03/1"}, ["node03", "node04"]),                # PBS Pro
    ({"exec_vnode": "(node01[0]:ncpus=2)+(node02:ncpus=2+node02[1]:ncpus=1)"}, ["node01", "node02"]),
    ({}, []),
])
def test_the_nodes_of_a_pbs_job_record(record: dict[str, str], hosts: list[str]) -> None:
    from orchestrator.backends.pbs.commands import exec_hosts

    assert exec_hosts(record) == hosts


def test_every_node_asked_for_is_reported_and_one_that_never_answered_fails(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    """Two nodes asked, the scheduler names none, one node's facts arrive: two reports, and the
    checks fail (never a pass on the one that answered)."""
    _fake_job(monkeypatch, PBSProbe, [("running", [])])
    _write(tmp_path, "n1", _facts("n1"))
    reports = PBSProbe(tmp_path, 2, None, None).run()
    assert len(reports) == 2 and [report.node for report in reports if report.facts] == ["n1"], reports
    checks = {check.name: check for check in node_checks(reports, None)}
    assert checks["nodes: python"].status is Status.FAIL, checks
    assert checks["clocks"].status is not Status.PASS and checks["shared filesystem"].status is not Status.PASS


def test_no_node_answering_is_never_a_pass(tmp_path: Path) -> None:
    for reports in ([], [NodeReport("n1", None, None, None, "no facts from n1 within 90 s")]):
        checks = {check.name: check for check in node_checks(reports, "torch")}
        assert checks["nodes: python"].status is Status.FAIL, checks
        assert all(check.status is not Status.PASS for check in checks.values()), checks
        [checkpoints] = checkpoint_checks(CheckpointMarks(tmp_path), reports)
        assert checkpoints.status is Status.FAIL, checkpoints


def test_the_checkpoint_check_fails_for_a_node_that_never_answered(tmp_path: Path) -> None:
    marks = CheckpointMarks(tmp_path)
    marks.node_file("n1").write_text("1")
    answered = NodeReport("n1", _facts("n1"), 2.0, None)
    silent = NodeReport("n2", None, None, None, "no facts from n2 within 90 s")
    [check] = checkpoint_checks(marks, [answered, silent])
    assert check.status is Status.FAIL and "n2" in check.detail and "n1" not in check.detail, check


def test_facts_of_a_node_whose_host_name_is_its_fqdn_are_matched(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    _fake_job(monkeypatch, SlurmProbe, [("running", ["n1"])])
    _write(tmp_path, "n1.cluster.example.org", _facts("n1.cluster.example.org"))
    [report] = SlurmProbe(tmp_path, 1, None, None).run()
    assert report.node == "n1" and report.facts is not None and not report.error, report


def test_a_node_names_its_facts_as_the_scheduler_names_it(tmp_path: Path) -> None:
    from injectors.probe import node_name

    assert node_name({"SLURMD_NODENAME": "n1"}, "n1.cluster.example.org") == "n1"
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("cn01\ncn01\ncn02\n")
    assert node_name({"PBS_NODEFILE": str(nodefile)}, "cn02.hpc.example.org") == "cn02"
    assert node_name({}, "cn03.hpc.example.org") == "cn03.hpc.example.org"


def test_the_visibility_delay_does_not_include_the_doctors_polling(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """The node writes its facts just after a state poll that still says queued: the login node
    reads them while it waits for the next poll, not after it."""
    def node_starts(said: tuple[str, list[str]]) -> None:
        if said[0] == "queued":
            _write(tmp_path, "n1", _facts("n1"))

    _fake_job(monkeypatch, SlurmProbe, [("queued", []), ("running", ["n1"])], node_starts)
    [report] = SlurmProbe(tmp_path, 1, None, None).run()
    assert report.visible_after_s is not None and report.visible_after_s < 0.5, report.visible_after_s


def test_a_pbs_job_gone_from_qstat_is_said_ended_at_once_with_its_output(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """PBS Pro without job history forgets a finished job: qstat no longer knows it."""
    import orchestrator.backends.pbs.commands as commands

    monkeypatch.setenv("FAULTDRILL_PBS_SERVER", "pro")
    monkeypatch.setattr(commands, "run_command", lambda args, **_: CommandResult(
        tuple(args), 35, "", "qstat: Unknown Job Id 19.pbs01", 0.01))
    monkeypatch.setattr(probe_job, "START_TIMEOUT_S", 3.0)
    (tmp_path / "job.out").write_text("prologue: node refused the job")
    monkeypatch.setattr(PBSProbe, "_submit", lambda probe: "19.pbs01")
    cancelled: list[str] = []
    monkeypatch.setattr(PBSProbe, "_cancel", lambda probe, job_id: cancelled.append(job_id))
    started = time.monotonic()
    with pytest.raises(CommandError) as raised:
        PBSProbe(tmp_path, 1, None, None).run()
    assert "gone from qstat" in raised.value.reason and "prologue: node refused" in raised.value.reason
    assert time.monotonic() - started < 2.0
