"""The quick drill with ``backend: pbs`` on the local cluster, whose PBS commands are Slurm's Torque
wrappers: torch ranks on both nodes started by mpiexec, a rank SIGKILLed by the fault agent on its
node, resubmission with qsub from the newest valid checkpoint, and a final state identical to the
fault-free twin. The report carries the same recovery fields as the Slurm drill's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from campaigns import drill_report
from experiments.layout import (
    EVENT_JOB_START,
    EVENT_STEP_EXIT,
    RunPaths,
    attempt_event_lines,
    first_event,
    read_attempt_events,
)
from faultdrill_cli import FULL_ONLY
from orchestrator.backends.pbs.commands import EXIT_CODE_FILE, qdel, qstat_all, qstat_states
from orchestrator.observe.failure_signs import WALLTIME_SLACK_S
from orchestrator.report.document import RECOVERY_FIELDS as REPORTED_RECOVERY_FIELDS

REPO = Path(__file__).resolve().parents[2]
SHARED_TMP_ROOT = Path("/var/tmp/faultdrill-tests")  # outside /tmp: the nodes have a private one
DRILL_TIMEOUT_S = 600
STEPS_PAST_WARNING = 300  # the preempt and walltime runs' steps
RECOVERY_FIELDS = set(REPORTED_RECOVERY_FIELDS)  # the contract, as the Slurm and local drills report it


def _pbs_quick_spec(workdir: Path, destination: Path) -> Path:
    """slurm-quick's settings (2 nodes x 2 torch ranks, SIGKILL after the first checkpoint, a
    baseline twin), submitted through PBS."""
    spec = yaml.safe_load((REPO / "experiments" / "campaigns" / "slurm-quick.yaml").read_text())
    spec.update(name="pbs-quick", backend="pbs", workdir=str(workdir))
    destination.write_text(yaml.safe_dump(spec))
    return destination


def _drill(spec_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``spec`` and drill it; its report (also kept at FAULTDRILL_KEEP_REPORT when set)."""
    spec_path.write_text(yaml.safe_dump(spec))
    return drill_report(spec_path, DRILL_TIMEOUT_S)


def _run(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    return next(run for run in report["runs"] if run["run_id"] == run_id)


@FULL_ONLY  # CI: the same checks on the rank kill of the sweep below (1 rank a node)
def test_pbs_quick_drill_recovers_on_two_nodes(shared_tmp: Path, cluster) -> None:
    spec = _pbs_quick_spec(shared_tmp / "work", shared_tmp / "pbs-quick.yaml")
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    job_ids = [attempt["job_id"] for run in report["runs"] for attempt in run["attempts"]]
    try:
        _check_report(report, shared_tmp, cluster, "r000")
        _check_scheduler_view(report, shared_tmp, "r000")
    finally:
        for job_id in job_ids:
            qdel(job_id, None)


def _check_report(report: dict[str, Any], shared_tmp: Path, cluster, run_id: str) -> None:
    """``run_id``, a rank killed after its first checkpoint: on both nodes, resubmitted with qsub,
    every recovery field measured, ended as its twin."""
    assert report["backend"] == "pbs"
    faulted = _run(report, run_id)
    assert faulted["status"] == "completed"
    assert faulted["final_step"] == faulted["target_steps"]
    assert faulted["nodes"] == 2 and faulted["ranks"] % 2 == 0
    assert any(fault["at"] and fault["outcome"] == "injected" for fault in faulted["faults"])
    recoveries = faulted["recoveries"]
    assert recoveries and all(set(recovery) == RECOVERY_FIELDS for recovery in recoveries)
    # Every field is measured (fallback_from_step is null when the resume skipped nothing; spare and
    # state_source are restart.strategy warm's, null under the others).
    assert all(value is not None for recovery in recoveries for key, value in recovery.items()
               if key not in ("fallback_from_step", "spare", "state_source"))
    assert all(recovery["spare"] is None and recovery["state_source"] is None for recovery in recoveries)
    assert any(recovery["resumed_from_step"] > 0 for recovery in recoveries)
    assert faulted["identical_to_baseline"] is True
    assert _run(report, "r000-baseline")["status"] == "completed"  # the twin of every run here

    paths = RunPaths(shared_tmp / "work" / "runs" / run_id)
    nodes = {json.loads(paths.rank_file(0, rank).read_text())["node"] for rank in range(faulted["ranks"])}
    assert len(nodes) == 2 and nodes <= set(cluster), f"ranks ran on {nodes}, expected 2 nodes of {set(cluster)}"
    start = attempt_event_lines(paths, 0)[0]
    assert start["event"] == "job_start" and start["job_id"] == faulted["attempts"][0]["job_id"]


def _check_scheduler_view(report: dict[str, Any], shared_tmp: Path, run_id: str) -> None:
    """qstat still lists every attempt of ``run_id`` (a job each) and its twin under its name; the
    killed attempt's record says it failed."""
    faulted = _run(report, run_id)
    listed = qstat_all()
    for run in report["runs"]:
        if run["run_id"] != run_id and not run["is_baseline"]:
            continue  # an in-allocation run's attempts share one job, named by its first
        for number, attempt in enumerate(run["attempts"]):
            assert listed[attempt["job_id"]]["Job_Name"] == f"fd-{report['drill_id']}-{run['run_id']}-a{number}"
    failed_job = faulted["attempts"][0]["job_id"]
    folder = shared_tmp / "work" / "runs" / run_id / "submitit"
    assert int((folder / EXIT_CODE_FILE.format(job=failed_job)).read_text()) != 0
    last_job = faulted["attempts"][-1]["job_id"]
    states = qstat_states([failed_job, last_job], {failed_job: folder, last_job: folder})
    assert states[failed_job].value == "FAILED" and states[last_job].value == "COMPLETED"


@pytest.fixture(scope="module")
def sweep(_cluster_up: tuple[bool, str]) -> Iterator[tuple[dict[str, Any], Path]]:
    """One drill, its runs side by side (the walltime run's minute bounds it): a preemption (r000),
    a walltime (r001), a rank SIGKILL (r002), and a kill then a hang under in-allocation (r003), 2
    nodes x 1 rank each, sharing one twin. Paced steps, 42 s of training: the walltime run is still
    training at its warning, 40 s into its minute, whatever its start-up took, and what it has left
    (what its start-up took, and 2 s) fits in the next job's 40 s before that one's warning (a job
    warned saves and trains no more: a third job would cost another minute). Few slow steps, not
    many fast ones: a step costs a rank ~5 ms of CPU whatever its pace, and ten ranks stepping every
    30 ms starved the walltime run's start-up of its minute."""
    if not _cluster_up[0]:
        pytest.skip("cluster not up")  # _require_cluster fails the tests themselves when it must be up
    shared = SHARED_TMP_ROOT / f"pbs-sweep-{uuid.uuid4().hex[:8]}"
    shared.mkdir(parents=True)
    spec_path = _pbs_quick_spec(shared / "work", shared / "pbs-sweep.yaml")
    spec = yaml.safe_load(spec_path.read_text())
    spec.update(name="pbs-sweep", parallel_runs=5)
    spec["workload"].update(steps=STEPS_PAST_WARNING, batch_size=16, step_s=0.14)
    spec["checkpoint"] = {"every_steps": 125, "keep": 3}
    spec["resources"].update(tasks_per_node=1, warning_s=20)
    # workload.setup (issue 23): its lines run in the batch script before the launch.
    spec["workload"]["setup"] = ['echo "faultdrill setup: ran on $(hostname)" >&2']
    spec.pop("faults")
    after_checkpoint = {"after": {"fixed": 0.3}, "anchor": "first_checkpoint"}
    spec["sweep"] = {"grid": [
        {"faults": [[{"kind": "preempt", "after": {"at_step": 50}, "grace_s": 30}]]},
        {"faults": [[{"kind": "timeout", "after": {"at_step": 12}}]], "resources.time": ["00:01:00"]},
        {"faults": [[{"kind": "kill-rank", "rank": "random", "signal": "SIGKILL", **after_checkpoint}]]},
        {"faults": [[{"kind": "kill-rank", "rank": 1, **after_checkpoint},
                     {"kind": "hang-rank", "rank": 0, **after_checkpoint}]],
         "restart.strategy": ["in-allocation"], "restart.hang_timeout_s": [5]}]}
    report = _drill(spec_path, spec)
    if keep := os.environ.get("FAULTDRILL_KEEP_REPORT"):
        Path(keep + ".logs").write_text(_batch_logs(shared / "work", "r003"))
    try:
        yield report, shared
    finally:
        for run in report["runs"]:
            for attempt in run["attempts"]:
                qdel(attempt["job_id"], None)
        shutil.rmtree(shared, ignore_errors=True)


def test_pbs_kill_resubmits_on_both_nodes_and_qstat_shows_every_attempt(sweep, cluster) -> None:
    """A rank SIGKILLed by the agent after the first checkpoint (r002) recovers in a new job as the
    quick drill's does (its checks above)."""
    report, shared = sweep
    _check_report(report, shared, cluster, "r002")
    _check_scheduler_view(report, shared, "r002")


def test_pbs_in_allocation_launches_mpiexec_again_in_the_same_job(sweep) -> None:
    """restart.strategy in-allocation under PBS (r003): a killed rank ends the mpiexec launch, a hung
    one is SIGKILLed by the agent (PBS cannot end a launch alone); both times the batch script
    launches the ranks again in its allocation, and the run ends bit for bit as its twin in one job."""
    report, shared = sweep
    faulted = _run(report, "r003")
    assert faulted["status"] == "completed" and faulted["identical_to_baseline"] is True, faulted["attempts"]
    attempts = faulted["attempts"]
    summary = [(a["job_id"], a["state"], a["failure_class"], (a["reason"] or "")[:100]) for a in attempts]
    assert len({attempt["job_id"] for attempt in attempts}) == 1, (summary, _batch_logs(shared / "work", "r003")[-3000:])
    assert [(a["state"], a["failure_class"]) for a in attempts[:2]] == [("STEP_FAILED", "RANK_SIGNAL"),
                                                                     ("STEP_FAILED", "HANG")], attempts
    recoveries = faulted["recoveries"]
    assert [(r["fault_kind"], r["strategy"]) for r in recoveries] == [("kill-rank", "in-allocation"),
                                                                      ("hang-rank", "in-allocation")]
    assert all(r["queue_s"] < 5 for r in recoveries), "a relaunch does not queue"
    hang = next(fault for fault in faulted["faults"] if fault["kind"] == "hang-rank")
    assert attempts[1]["failed_nodes"] == [hang["target"].split("@", 1)[1]], (attempts[1], hang)


def _batch_logs(workdir: Path, run_id: str = "r000") -> str:
    """The tail of a run's batch script and rank logs (what a failed relaunch said)."""
    folder = workdir / "runs" / run_id / "submitit"
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                     for path in sorted(folder.glob("*.err")) + sorted(folder.glob("*_log.out")))


def test_pbs_preempt_and_walltime_warn_the_ranks_who_save_and_lose_no_work(sweep) -> None:
    """PBS has no qsig here and moves no running job's walltime: a preemption is the agent's
    warning to every verified rank on both nodes, then qdel; a walltime is the job's own (a minute),
    its warning sent by the batch script ``resources.warning_s`` before it and forwarded by mpiexec.
    Both times the ranks save on the warning, the run resumes at that step in a new job (nothing
    lost) and ends bit for bit as its twin; the classes are PREEMPTED and TIMEOUT (Slurm's accounting
    under the wrappers says TIMEOUT: qstat says only that the job finished)."""
    report, _ = sweep
    for run_id, kind, first_class in (("r000", "preempt", "PREEMPTED"), ("r001", "timeout", "TIMEOUT")):
        run = _run(report, run_id)
        assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["attempts"]
        [fault] = run["faults"]
        assert fault["outcome"] == "injected", fault
        saved = int(re.search(r"ranks saved step (\d+)", fault["detail"]).group(1))
        assert 0 < saved < STEPS_PAST_WARNING and saved % 10 == 0, fault["detail"]
        hit = fault["attempt"]
        # The walltime is the job's own: where a loaded host's start-up kept the ranks from the
        # fault's step until the warning (which ends their training), that job ended TIMEOUT without
        # it, a natural failure, and the fault fired in the next job.
        assert hit == 0 or (kind == "timeout" and all(
            a["failure_class"] == "TIMEOUT" for a in run["attempts"][:hit])), (hit, run["attempts"])
        assert run["attempts"][hit]["failure_class"] == first_class, run["attempts"]
        [recovery] = [recovery for recovery in run["recoveries"] if recovery["attempt"] == hit + 1]
        assert recovery["fault_kind"] == kind and recovery["failure_class"] == first_class, recovery
        assert recovery["resumed_from_step"] == saved and recovery["lost_steps"] == 0, recovery
    preempt = _run(report, "r000")["faults"][0]
    assert preempt["signal"] == "SIGUSR2" and "cancelled" in preempt["detail"], preempt
    walltime = _run(report, "r001")["faults"][0]
    assert "walltime kept at 00:01:00" in walltime["detail"], walltime
    assert "faultdrill setup: ran on" in _batch_logs(sweep[1] / "work", "r000"), "workload.setup ran in the batch script"
    # The batch script outlived the walltime's SIGTERM and recorded how the launch ended, at start +
    # walltime: where a PBS server keeps no job history, that record alone dates the end (TIMEOUT).
    events = read_attempt_events(RunPaths(sweep[1] / "work" / "runs" / "r001"), 0)
    started, [ended] = first_event(events, EVENT_JOB_START), [e for e in events if e.name == EVENT_STEP_EXIT]
    assert started is not None and ended.time >= started.time + 60 - WALLTIME_SLACK_S, (started, ended)
