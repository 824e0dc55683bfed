"""The controller-side fault kinds' safety and bookkeeping without a cluster (issue 8): a node is
acted on only if the scheduler lists it in the job's allocation; the project's cluster script only
on its own cluster (a site needs its own command); the mending always runs; disk-full refuses a big
filesystem; a failed checkpoint write on a full disk is named as such; the warning signal parses.
The real thing: tests/drill/test_fault_catalogue_local.py and tests/cluster/test_fault_catalogue.py."""

from __future__ import annotations

import errno
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from experiments.runtime.checkpoint import explain_write_failure
from experiments.runtime.warning import WarningNote, warning_signal
from injectors.kinds import get_kind
from injectors.kinds.base import FaultTask
from injectors.targets import TargetRefused
from orchestrator.backends.base import Backend
from orchestrator.campaign.capabilities import LOCAL, SLURM
from orchestrator.faults.job_control import BackendJobControl, Mend, Menders


@dataclass
class RecordingBackend(Backend):
    """Answers like a scheduler with a two-node job 7 (recorded), and notes what it was asked."""

    capabilities = SLURM

    name: str = "slurm"
    asked: list[str] = field(default_factory=list)

    def submit(self, run, job):  # noqa: ANN001, ANN201 - never called here
        raise AssertionError

    def find_submitted(self, ref):  # noqa: ANN001, ANN201
        return []

    def poll(self, job_ids):  # noqa: ANN001, ANN201
        from orchestrator.states import JobState
        return {job_id: JobState.RUNNING for job_id in job_ids}

    def cancel(self, job_id: str, force: bool = False) -> None:
        self.asked.append(f"cancel {job_id}")

    def run_agent(self, job_id, node, argv, timeout_s):  # noqa: ANN001, ANN201
        raise AssertionError

    def job_nodes(self, job_id: str) -> list[str]:
        return ["fd-n1", "fd-n2"]


def _control(backend: Backend) -> BackendJobControl:
    return BackendJobControl(backend, "7", signal_by_agent=lambda name: None, menders=Menders(Path("/nonexistent")))


def _task(tmp_path: Path, kind: str, **options: object) -> FaultTask:
    return FaultTask(kind=kind, run_dir=tmp_path / "run", run_id="r000", attempt=0, job_id="7", options=options)


def test_a_node_outside_the_allocation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetRefused, match=r"node 'fd-n9' is not in job 7's allocation \(fd-n1, fd-n2\)"):
        _control(RecordingBackend()).cluster("node-crash", "fd-n9", [sys.executable, "-c", "pass"])


def test_the_cluster_script_acts_only_on_its_own_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.faults.job_control.CLUSTER_ENV", tmp_path / "no-cluster.env")
    with pytest.raises(TargetRefused, match="not the project's own cluster.*names no site command"):
        _control(RecordingBackend()).cluster("node-crash", "fd-n2", None)


@pytest.mark.drill
def test_a_site_command_is_run_with_the_node_filled_in_and_the_mending_always_runs(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write = [sys.executable, "-c", f"import sys; open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); import os, time; os.close(1); os.close(2); time.sleep(0.3)"]
    task = _task(tmp_path, "node-crash", node=-1, down_s=0,
                 command={"act": [*write, "off", "{node}"], "mend": [*write, "on", "{node}"]})
    control, acted = _control(RecordingBackend()), []
    control.on_acted = lambda at, node: acted.append((node, log.exists()))
    outcome = get_kind("node-crash").act_on_controller(task, control)
    assert log.read_text().splitlines() == ["off fd-n2", "on fd-n2"]
    assert outcome.target == "node fd-n2" and outcome.node == "fd-n2"
    # The controller hears of the node as the command starts: the job's step can fail before it returns.
    assert acted == [("fd-n2", False)], "the node is recorded before the site command acts"


@pytest.mark.drill
def test_a_failed_mend_is_told_but_the_fault_stands(tmp_path: Path) -> None:
    task = _task(tmp_path, "network-partition", node=0, duration_s=0.01,
                 command={"act": [sys.executable, "-c", "print('cut')"], "mend": [sys.executable, "-c", "exit(3)"]})
    outcome = get_kind("network-partition").act_on_controller(task, _control(RecordingBackend()))
    assert outcome.target == "node fd-n1" and "NOT MENDED" in outcome.detail and outcome.detail.startswith("cut (the command took ")


def test_a_backend_without_a_walltime_action_refuses_timeout(tmp_path: Path) -> None:
    class Local(RecordingBackend):
        capabilities = LOCAL

    with pytest.raises(TargetRefused, match="the local backend cannot move a running job's time limit"):
        get_kind("timeout").act_on_controller(_task(tmp_path, "timeout", in_s=1), _control(Local(name="local")))


def test_disk_full_refuses_a_filesystem_with_more_room_than_it_may_fill(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(TargetRefused, match="more than max_fill_mb"):
        get_kind("disk-full").act_on_controller(_task(tmp_path, "disk-full", max_fill_mb=0.001),
                                                _control(RecordingBackend()))
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []


def test_a_write_that_failed_on_a_full_disk_is_named_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hidden = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 109888 vs 109824")
    assert explain_write_failure(hidden, tmp_path, 40) is hidden  # room enough: not the disk's fault
    monkeypatch.setattr("experiments.runtime.checkpoint._free_bytes", lambda directory: 300_000)
    named = explain_write_failure(hidden, tmp_path, 40)
    assert isinstance(named, OSError) and named.errno == errno.ENOSPC
    assert str(named).startswith("[Errno 28] checkpoint step 40 could not be written: no space left on device (0.3 MB")


def test_an_out_of_space_errno_anywhere_in_the_chain_names_the_disk_with_room_left(tmp_path: Path) -> None:
    """A quota (EDQUOT) hit with free space on the filesystem: the errno in the cause says it."""
    try:
        try:
            raise OSError(122, "Disk quota exceeded")
        except OSError as quota:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from quota
    except RuntimeError as wrapped:
        named = explain_write_failure(wrapped, tmp_path, 40)
    assert isinstance(named, OSError) and named.errno == errno.EDQUOT
    assert str(named).startswith("[Errno 122] checkpoint step 40 could not be written: disk quota exceeded (")
    plain = RuntimeError("a bug in the save code")
    assert explain_write_failure(plain, tmp_path, 40) is plain


def test_the_warning_signal_is_named_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert warning_signal({}) is signal.SIGUSR2
    assert warning_signal({"FAULTDRILL_WARNING_SIGNAL": "TERM"}) is signal.SIGTERM
    with pytest.raises(ValueError, match="is not a signal name"):
        warning_signal({"FAULTDRILL_WARNING_SIGNAL": "SIGNOPE"})
    note = WarningNote(signal.SIGUSR1).install()
    try:
        assert not note.received
        signal.raise_signal(signal.SIGUSR1)
        assert note.received and note.received_at is not None
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


@pytest.mark.drill
def test_a_node_down_for_the_rest_of_the_drill_is_owed_a_mend_that_survives_the_controller(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write = [sys.executable, "-c", f"import sys; open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); import os, time; os.close(1); os.close(2); time.sleep(0.3)"]
    task = _task(tmp_path, "node-crash", node=0, down_s=None,
                 command={"act": [*write, "off", "{node}"], "mend": [*write, "on", "{node}"]})
    control = BackendJobControl(RecordingBackend(), "7", signal_by_agent=lambda name: None, menders=Menders(tmp_path))
    outcome = get_kind("node-crash").act_on_controller(task, control)
    assert "for the rest of the drill" in outcome.detail
    assert log.read_text().splitlines() == ["off fd-n1"]  # not mended yet
    # The controller died: the next one finds the owed action in the workdir and runs it once.
    said = Menders(tmp_path).run_all()
    assert said == ["node-restore fd-n1: "] and log.read_text().splitlines() == ["off fd-n1", "on fd-n1"]
    assert Menders(tmp_path).run_all() == []


@pytest.mark.drill
def test_a_mend_that_fails_stays_owed_and_is_tried_again(tmp_path: Path) -> None:
    """Issue 21, item 10: a node whose restore failed was dropped from the owed actions and never
    retried; it stays owed until it works."""
    flag = tmp_path / "works"
    attempt = [sys.executable, "-c", f"import pathlib, sys; sys.exit(0 if pathlib.Path({str(flag)!r}).exists() else 1)"]
    Menders(tmp_path).add(Mend(argv=attempt, what="node-restore fd-n1"))
    [said] = Menders(tmp_path).run_all()
    assert "FAILED" in said
    flag.touch()
    assert Menders(tmp_path).run_all() == ["node-restore fd-n1: "]
    assert Menders(tmp_path).run_all() == []


def test_disk_full_owes_the_ballasts_removal_before_it_fills_the_filesystem(tmp_path: Path, monkeypatch) -> None:
    """Issue 21, item 19: a controller killed while the checkpoint filesystem is full left the
    ballast behind (every later checkpoint hit ENOSPC). Its removal is owed before the fill, and
    the next controller removes it."""
    from injectors.kinds import disk_full

    class Died(BaseException):
        pass

    def fill_then_die(path: Path, size: int) -> int:
        path.write_bytes(b"x" * 1024)
        raise Died()

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(disk_full, "_fill", fill_then_die)
    control = BackendJobControl(RecordingBackend(), "7", signal_by_agent=lambda name: None, menders=Menders(tmp_path))
    monkeypatch.setattr(control, "verify_running", lambda fresh=True: None)
    task = FaultTask(kind="disk-full", run_dir=run_dir, run_id="r", attempt=0, job_id="7", options={"max_fill_mb": 1e9})
    with pytest.raises(Died):
        get_kind("disk-full").act_on_controller(task, control)
    [ballast] = (run_dir / "checkpoints").glob(f"{disk_full.BALLAST_PREFIX}*")
    [said] = Menders(tmp_path).run_all()
    assert not ballast.exists() and said.startswith(f"remove {ballast}")


def test_a_job_level_fault_that_comes_after_its_attempt_is_refused_as_gone(tmp_path: Path) -> None:
    """Issue 21, item 8: under a same-job strategy the job runs on as the next attempt; a fault
    aimed at the attempt before it, acting late, must not hit it (and be credited to the old one):
    it checks the fence, not only that the job runs."""
    from experiments.layout import RunPaths
    from experiments.runtime.fence import Fence, write_fence

    paths = RunPaths(tmp_path / "run")
    control = BackendJobControl(RecordingBackend(), "7", signal_by_agent=lambda name: None,
                                menders=Menders(tmp_path), fence=(paths, 0))
    write_fence(paths, Fence(0, "7"))
    control.verify_running()  # attempt 0 runs in job 7
    write_fence(paths, Fence(1, "7"))  # relaunched in the same job as attempt 1
    with pytest.raises(TargetRefused, match="attempt 1") as refused:
        control.verify_running()
    assert refused.value.gone


def test_a_preemption_whose_attempt_moved_on_in_its_grace_time_ends_nothing(tmp_path: Path, monkeypatch) -> None:
    """Review of item 8: the ranks exited in the grace time and the job went on as attempt 1 (in
    the same job): the preemption aimed at attempt 0 must not cancel it."""
    from experiments.layout import RunPaths
    from experiments.runtime.fence import Fence, write_fence
    from injectors.kinds import preempt

    paths = RunPaths(tmp_path / "run")
    write_fence(paths, Fence(0, "7"))
    backend = RecordingBackend()
    control = BackendJobControl(backend, "7", signal_by_agent=lambda name: None, menders=Menders(tmp_path),
                                fence=(paths, 0))
    monkeypatch.setattr(control, "signal_ranks", lambda name: None)

    def relaunched_meanwhile(*args: object) -> None:
        write_fence(paths, Fence(1, "7"))

    monkeypatch.setattr(preempt, "wait_for_warned", relaunched_meanwhile)
    with pytest.raises(TargetRefused, match="attempt 1") as refused:
        get_kind("preempt").act_on_controller(_task(tmp_path, "preempt", grace_s=1.0), control)
    assert refused.value.gone and not any(asked.startswith("cancel") for asked in backend.asked), backend.asked


@pytest.mark.drill
def test_a_timed_node_crash_owes_its_restore_while_it_holds_and_not_after(tmp_path: Path, monkeypatch) -> None:
    """Review of items 10 and 19: a controller killed while a node is down for down_s left it down
    (its restore was owed only for the rest of the drill's faults); owed before it breaks, the
    restore is discharged once the fault carried it out."""
    from injectors.kinds import node_faults

    log = tmp_path / "log"
    write = [sys.executable, "-c", f"import sys; open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); import os, time; os.close(1); os.close(2); time.sleep(0.3)"]
    task = _task(tmp_path, "node-crash", node=0, down_s=0.1,
                 command={"act": [*write, "off", "{node}"], "mend": [*write, "on", "{node}"]})
    control = BackendJobControl(RecordingBackend(), "7", signal_by_agent=lambda name: None, menders=Menders(tmp_path))
    owed_while_down = []
    real_sleep = node_faults.time.sleep
    this_thread = threading.current_thread()  # time.sleep is patched for every thread: only the fault's counts

    def the_hold(seconds: float) -> None:
        # and only its own hold: subprocess's wait for the cluster command sleeps too, when the
        # command has not exited as its output closed (a loaded machine)
        if threading.current_thread() is this_thread and sys._getframe(1).f_globals["__name__"] == node_faults.__name__:
            owed_while_down.append((tmp_path / "owed-cluster-actions.json").exists())
        real_sleep(seconds)

    monkeypatch.setattr(node_faults.time, "sleep", the_hold)
    get_kind("node-crash").act_on_controller(task, control)
    assert owed_while_down == [True], "the restore was not owed while the node was down"
    assert log.read_text().splitlines() == ["off fd-n1", "on fd-n1"]
    assert Menders(tmp_path).run_all() == [], "mended by the fault: nothing owed after it"


def test_owed_actions_of_a_finished_drill_follow_its_workdir_to_the_next_drill(tmp_path: Path) -> None:
    """Review of item 10: a mend that failed stayed owed in the workdir, but the next drill archived
    the workdir with it and never tried it again. The owed actions move to the new workdir, whose
    controller runs them first."""
    import time as clock

    import yaml

    from orchestrator.campaign.spec import load_campaign
    from orchestrator.control.workdir import prepare_workdir
    from orchestrator.faults.job_control import MENDS_NAME
    from orchestrator.record.ledger import Ledger

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "owed", "backend": "local", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 10},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"}}))
    campaign = load_campaign(spec)
    campaign.workdir.mkdir()
    ledger = Ledger.in_workdir(campaign.workdir)
    ledger.set_meta("finished", clock.time())
    ledger.close()
    Menders(campaign.workdir).add(Mend(argv=["true"], what="node-restore fd-n1"))
    archive = prepare_workdir(campaign)
    assert archive is not None and not (archive / MENDS_NAME).exists()
    assert [mend["what"] for mend in json.loads((campaign.workdir / MENDS_NAME).read_text())] == ["node-restore fd-n1"]


def test_a_fault_that_checks_its_job_reads_the_controllers_poll_not_a_scheduler_of_its_own() -> None:
    """Review of issue 22 (item 8): disk-full asked squeue every second through the backend, outside
    the controller's rate-limited poller. A loop's check of a watched job reads the poller's last
    word; a job no longer watched, or a check before an act, asks the scheduler."""
    from orchestrator.states import JobState

    class Counting(RecordingBackend):
        def poll(self, job_ids):  # noqa: ANN001, ANN201
            self.asked.append("poll")
            return super().poll(job_ids)

    backend = Counting()
    heard = [JobState.RUNNING]
    control = BackendJobControl(backend, "7", signal_by_agent=lambda name: None, menders=Menders(Path("/nonexistent")),
                                known_state=lambda: heard[0])
    for _ in range(5):
        control.verify_running(fresh=False)
    assert backend.asked == [], "no scheduler call of the loop's own"
    heard[0] = JobState.FAILED
    with pytest.raises(TargetRefused, match="job 7 is FAILED"):
        control.verify_running(fresh=False)
    heard[0] = None  # type: ignore[call-overload]  # the controller watches another job now
    control.verify_running(fresh=False)
    assert backend.asked == ["poll"]
    # Before an act (second review: a stale RUNNING let preempt requeue a job that had completed),
    # the scheduler is asked, whatever the controller last heard.
    heard[0] = JobState.RUNNING
    control.verify_running()
    assert backend.asked == ["poll", "poll"]
