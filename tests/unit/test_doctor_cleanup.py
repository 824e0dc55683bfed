"""``faultdrill doctor`` leaves the site as it found it (review of issue 22): the checkpoint
directory it checks is the spec's deepest one without ``{run_id}`` and is not made by it; its files
there are its own run's (two doctors on one directory do not break each other, a stranger's file is
never touched) and a file it cannot write or remove is a failed check; SIGTERM and SIGHUP end it
with its cleanup done (marks removed, the test job cancelled)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from injectors.probe import checkpoint_facts
from orchestrator.doctor.checks import Status
from orchestrator.doctor.marks import CheckpointMarks
from orchestrator.doctor.probe_job import NodeReport

pytestmark = pytest.mark.unit


def test_the_checkpoint_directory_checked_is_the_deepest_without_the_run_id(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.doctor as doctor
    from orchestrator.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "ck", "backend": "local", "workdir": str(tmp_path / "work"),
                                "workload": {"framework": "torch", "steps": 10},
                                "checkpoint": {"directory": f"{tmp_path}/drill/ckpt-{{run_id}}/state"}}))
    asked: list[Any] = []
    monkeypatch.setattr(doctor, "diagnose", lambda site: asked.append(site) or doctor.Diagnosis(site, [], []))
    assert main(["doctor", str(spec), "--format", "json"]) == 0
    assert asked[0].checkpoints == tmp_path / "drill"


def test_a_checkpoint_directory_not_made_yet_is_checked_at_its_nearest_parent_and_not_made(tmp_path: Path) -> None:
    from orchestrator.doctor.filesystems import check_checkpoint_directory

    checks = check_checkpoint_directory(tmp_path / "drill" / "deeper")
    assert not (tmp_path / "drill").exists(), "the doctor makes no directory of the drill's"
    assert all(check.status is Status.PASS for check in checks), checks
    assert any("does not exist yet" in check.detail and str(tmp_path) in check.detail for check in checks), checks
    assert sorted(tmp_path.iterdir()) == [], "its probe files removed"
    assert any(check.name == "checkpoints: flock" for check in checks), "the issue's list: flock there too"


def test_a_checkpoint_directory_without_flock_is_a_warning_not_a_failure(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The drill locks nothing in the checkpoint directory: no flock there is said, not failed."""
    import errno
    import fcntl

    from orchestrator.doctor.filesystems import check_checkpoint_directory

    def no_locks(*args: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    flock = {check.name: check for check in check_checkpoint_directory(tmp_path)}["checkpoints: flock"]
    assert flock.status is Status.WARN and "not supported" in flock.detail, flock


def test_two_doctors_on_one_checkpoint_directory_keep_each_others_files(tmp_path: Path) -> None:
    from orchestrator.doctor.nodes import CheckpointMarks

    stranger = tmp_path / ".faultdrill-doctor-node-n9"
    stranger.write_text("another user's leftover")
    with CheckpointMarks(tmp_path) as first:
        with CheckpointMarks(tmp_path) as second:
            assert checkpoint_facts(tmp_path, "n1", second.token)["sees_login_file"]
            second.expect(["n1"])
        said = checkpoint_facts(tmp_path, "n2", first.token)
        assert said["sees_login_file"] and said["wrote"], "the other doctor left this one's files alone"
        assert first.node_file("n2").is_file()
        first.expect(["n2"])
    assert sorted(tmp_path.iterdir()) == [stranger], "each removed its own files, and no one else's"
    assert not first.problems and not second.problems


def _unwritable(monkeypatch: pytest.MonkeyPatch) -> None:
    write_text = Path.write_text

    def refuse(path: Path, *args: Any, **kwargs: Any) -> int:
        if path.name.startswith(".faultdrill-doctor-") and "-login" in path.name:
            raise PermissionError(13, "Permission denied", str(path))
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refuse)


def test_a_mark_the_doctor_cannot_write_is_a_failed_check_with_the_reason(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.doctor as doctor

    checkpoints = tmp_path / "ck"
    checkpoints.mkdir()
    monkeypatch.setattr(doctor, "_scheduler_checks", lambda site: [])
    report = NodeReport("n1", {"node": "n1", "python": "/usr/bin/python3", "python_version": "3.11", "written_at": 1.0,
                               "checkpoints": {"sees_login_file": False, "wrote": True}}, None, None)
    monkeypatch.setattr(doctor, "_probe", lambda site, folder, token: [report])
    _unwritable(monkeypatch)
    diagnosis = doctor.diagnose(doctor.Site("local", tmp_path / "work", checkpoints=checkpoints))
    [check] = [check for check in diagnosis.checks if check.name == "checkpoints: nodes"]
    assert check.status is Status.FAIL and "Permission denied" in check.detail, check


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_ends_the_doctor_with_its_marks_removed_and_its_job_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals) -> None:
    import orchestrator.doctor as doctor
    import orchestrator.doctor.probe_job as probe_job

    checkpoints = tmp_path / "ck"
    checkpoints.mkdir()
    received: list[int] = []
    cancelled: list[str] = []
    before = signal.signal(signum, lambda number, _frame: received.append(number))

    def state(probe: probe_job.PBSProbe) -> tuple[str, list[str]]:
        assert [path.name for path in checkpoints.iterdir() if "-login" in path.name], "the login node's mark is there"
        os.kill(os.getpid(), signum)  # the session's ssh drops, or someone stops the doctor
        deadline = time.monotonic() + 5.0
        while not received and time.monotonic() < deadline:
            pass
        return "queued", []

    monkeypatch.setattr(doctor, "_scheduler_checks", lambda site: [])
    monkeypatch.setattr(probe_job.PBSProbe, "_submit", lambda probe: "17.pbs01")
    monkeypatch.setattr(probe_job.PBSProbe, "_state", state)
    monkeypatch.setattr(probe_job.PBSProbe, "_cancel", lambda probe, job_id: cancelled.append(job_id))
    try:
        with pytest.raises(KeyboardInterrupt):
            doctor.diagnose(doctor.Site("pbs", tmp_path / "work", checkpoints=checkpoints))
        assert cancelled == ["17.pbs01"] and sorted(checkpoints.iterdir()) == [], "cleaned up"
        assert not received, "the signal stopped the doctor, not the handler it found"
        assert signal.getsignal(signum) is not signal.SIG_IGN and signal.getsignal(signum) != signal.SIG_DFL
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 5.0
        while not received and time.monotonic() < deadline:
            pass
        assert received == [signum], "the handler it found is back"
    finally:
        signal.signal(signum, before)


def _scripted_probe(monkeypatch: pytest.MonkeyPatch, states: list[tuple[str, list[str]]],
                    cancelled: list[str]) -> None:
    """A PBS test job whose qstat answers ``states`` in turn (the last one from then on)."""
    import orchestrator.doctor as doctor
    import orchestrator.doctor.probe_job as probe_job

    def state(probe: probe_job.PBSProbe) -> tuple[str, list[str]]:
        return states.pop(0) if len(states) > 1 else states[0]

    monkeypatch.setattr(doctor, "_scheduler_checks", lambda site: [])
    monkeypatch.setattr(probe_job.PBSProbe, "_submit", lambda probe: "17.pbs01")
    monkeypatch.setattr(probe_job.PBSProbe, "_state", state)
    monkeypatch.setattr(probe_job.PBSProbe, "_cancel", lambda probe, job_id: cancelled.append(job_id))


def test_a_test_job_that_never_ran_is_cancelled_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 22: only a job that ran has a last step to wait for (not UNMARK_WAIT_S)."""
    import orchestrator.doctor as doctor
    import orchestrator.doctor.probe_job as probe_job

    cancelled: list[str] = []
    _scripted_probe(monkeypatch, [("queued", [])], cancelled)
    monkeypatch.setattr(probe_job, "START_TIMEOUT_S", 0.5)
    (tmp_path / "ck").mkdir()
    started = time.monotonic()
    diagnosis = doctor.diagnose(doctor.Site("pbs", tmp_path / "work", checkpoints=tmp_path / "ck"))
    assert cancelled == ["17.pbs01"] and time.monotonic() - started < probe_job.UNMARK_WAIT_S / 2
    assert diagnosis.failed


def test_a_signal_while_the_job_ends_still_cancels_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.doctor.probe_job as probe_job

    cancelled: list[str] = []
    probe = probe_job.PBSProbe(tmp_path, 1, None, None, marks=CheckpointMarks(tmp_path))
    probe.ran = True
    monkeypatch.setattr(probe_job.PBSProbe, "_cancel", lambda probe, job_id: cancelled.append(job_id))

    def interrupted(probe: probe_job.PBSProbe, within_s: float) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_job.PBSProbe, "_await_end", interrupted)
    with pytest.raises(KeyboardInterrupt):
        probe._end_job("17.pbs01")
    assert cancelled == ["17.pbs01"]


def test_a_job_ended_before_its_last_step_is_said_to_maybe_leave_the_files_no_one_here_saw(tmp_path: Path) -> None:
    from orchestrator.doctor.nodes import cleanup_check

    marks = CheckpointMarks(tmp_path)
    marks.expect(["n1", "n2"])
    marks.seen = {"n1": True, "n2": False}  # n2's file in a directory of its own
    assert cleanup_check(marks) == []
    marks.ended_by_itself = False
    [check] = cleanup_check(marks)
    assert check.status is Status.WARN and "n2: " in check.detail and "n1: " not in check.detail, check
