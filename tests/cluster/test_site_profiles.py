"""Issue 22: the drill on a site that is not the project's own, on the real cluster. No accounting
(slurmdbd stopped: `scripts/cluster accounting off`, sacct failing): a preempted drill recovers
from the queue and the run's own files, and its report says what it knew less of. Skewed clocks
(`scripts/cluster skew on`): the drill reads each node's offset and measures every phase on the
login clock; the doctor warns of them. Limits (`scripts/cluster limits on`: MaxArraySize 16,
MinJobAge 10 s, MaxSubmitJobs 8 enforced): a sweep of ten runs keeps to eight jobs at once, in an
array of eight and two single jobs, every run completed as its twin; the doctor reads the limits.
An ordinary user (`scripts/cluster user on`: fd-user), in the no-accounting and skew drill: it
drills as itself, writes nothing outside its directory, and is refused at plan the kinds that
need root. Slurm's memory cgroup (`scripts/cluster cgroup on`: task/cgroup, ConstrainRAMSpace): the
same ordinary user drills oom-rank, its rank made to outgrow the job's --mem, Slurm's OOM kill."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from conftest import CLUSTER_SCRIPT, CLUSTER_STATE_DIR, SHARED_TMP_ROOT, PlainUser, most_at_once, wait_until
from drills import api_workload
from experiments.layout import RunPaths
from orchestrator.record.clocks import load_clocks

DRILL_TIMEOUT_S = 600
FAKETIME_SEGMENTS = ("faketime_shm_", "sem.faketime_sem_")  # libfaketime's, in /dev/shm


def _spec(home: Path, name: str = "work") -> Path:
    """Two runs on fd-n1 (-1.6 s under the skew profile) and fd-n2 (+1.3 s), one rank each, and
    their shared twin: rank 1 (fd-n2) killed at step 150; the job preempted at step 120 (the
    scheduler ends it: only the scheduler could date that end). Its workdir: ``home/name``."""
    spec: dict[str, Any] = {
        "name": "site-profiles", "backend": "slurm", "workdir": str(home / name),
        "workload": {"framework": "torch", "params": 2000, "steps": 300, "step_s": 0.01, "seed": 4, "batch_size": 16},
        "checkpoint": {"every_steps": 100, "keep": 2},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug",
                      "extra_directives": ["--nodelist=fd-n1,fd-n2"]},
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2},
        "baseline": True, "parallel_runs": 3,
        "sweep": {"grid": [{"faults": [[{"kind": "kill-rank", "after": {"at_step": 150}, "rank": 1,
                                          "signal": "SIGKILL"}]]},
                           {"faults": [[{"kind": "preempt", "after": {"at_step": 120}, "grace_s": 20}]]}]},
    }
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_as_an_ordinary_user_without_accounting_and_on_skewed_clocks_a_drill_recovers_on_one_clock_and_says_so(
        shared_tmp: Path, plain_user: PlainUser, no_accounting: None, skewed_clocks: dict[str, float]) -> None:
    """Three profiles at once (they do not interfere). An ordinary user: fd-user is refused
    oom-rank and a node crash through scripts/cluster at plan, then drills as itself: its ranks'
    files are its own, and nothing of it lies outside its directory. No accounting: the preempted
    run recovers from the queue and the run's own files, and the report says what it knew less of.
    Skewed clocks: the drill reads both nodes' offsets, the kill's moment (stamped on fd-n2) and
    the new job's start are moved onto the login clock, the kill is credited with the failure it
    caused, no phase is clamped, and both runs end as their twin. The uncorrected stamps show what
    was reported before: the kill 'after' its own detection. Then the same campaign on one clock
    (the skew profile off): what the skew could have moved measures the same."""
    home = plain_user.own(shared_tmp / "home")
    _refused_at_plan(plain_user, home)
    sacct = subprocess.run(["sacct", "-X", "-n"], capture_output=True, text=True, timeout=60)
    assert sacct.returncode != 0, "the profile: sacct does not answer"
    spec = _spec(home)
    os.chown(spec, plain_user.uid, plain_user.gid)
    _doctor_warns_of_the_three_profiles(plain_user, home, spec)
    done = _as_user(plain_user, home, "drill", str(spec), "--format", "json")
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    killed, preempted = (next(run for run in report["runs"] if run["faults"] and run["faults"][0]["kind"] == kind)
                         for kind in ("kill-rank", "preempt"))
    for run in (killed, preempted):
        assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["attempts"]
        assert len(run["attempts"]) == 2 and run["recoveries"][0]["clocks_not_read"] == [], run["recoveries"]

    [recovery] = preempted["recoveries"]
    assert recovery["failure_class"] == "PREEMPTED" and recovery["lost_steps"] == 0, recovery
    assert "ranks saved step" in preempted["faults"][0]["detail"], "rank 0's warned checkpoint, on the login clock"
    [note] = report["site_notes"]
    assert note.startswith("accounting (sacct) did not answer") and "end time" in note

    paths = RunPaths(home / "work" / "runs" / killed["run_id"])
    assert {path.stat().st_uid for path in paths.heartbeats.iterdir()} == {plain_user.uid}, "the ranks ran as fd-user"
    clocks = load_clocks(paths.clocks_file(0))
    for node in ("fd-n1", "fd-n2"):
        reading = clocks.readings[node]
        assert abs(reading.offset_s - skewed_clocks[node]) <= reading.uncertainty_s + 0.005, (node, reading)
    [fault] = killed["faults"]
    [recovery] = killed["recoveries"]
    assert fault["outcome"] == "injected" and "fd-n2" in fault["target"], (fault["outcome"], fault["detail"])
    assert killed["attempts"][0]["ended"] - fault["at"] < 0, "uncorrected, fd-n2's stamp of the kill is after its detection"
    assert recovery["clock_correction_s"] < 0.05 and 0.0 < recovery["detect_s"] < 5.0 and recovery["queue_s"] > 0, recovery
    bounds = recovery["phase_uncertainty_s"]
    assert bounds["resubmit_s"] == 0 and 0 < bounds["detect_s"] < 0.05 and 0 < bounds["ttr_s"] < 0.1, bounds
    assert set(recovery["clock_offsets"]) == {"fd-n1", "fd-n2"}

    text = " ".join(_as_user(plain_user, home, "report", str(home / "work")).stdout.split())
    assert "This site: accounting (sacct) did not answer" in text
    # the report's line of node clocks: each node's offset as measured (fd-n1 -1.5999 +-0.0003 is -1.6)
    said = re.search(r"node clocks against the login node's \(s\): fd-n1 ([-+][0-9.]+) \+-([0-9.]+), fd-n2 ([-+][0-9.]+)", text)
    assert said is not None, text[-3000:]
    assert abs(float(said[1]) - skewed_clocks["fd-n1"]) <= float(said[2]) + 0.005, said[0]
    assert abs(float(said[3]) - skewed_clocks["fd-n2"]) <= 0.05, said[0]
    _nothing_outside(plain_user, home)

    subprocess.run([str(CLUSTER_SCRIPT), "skew", "off"], check=True, capture_output=True, timeout=60)
    one_clock = _spec(home, "one-clock")
    os.chown(one_clock, plain_user.uid, plain_user.gid)
    done = _as_user(plain_user, home, "drill", str(one_clock), "--format", "json")
    assert done.returncode == 0, done.stderr[-4000:]
    _measured_alike(report, json.loads(done.stdout))


def _doctor_warns_of_the_three_profiles(user: PlainUser, home: Path, spec: Path) -> None:
    """The doctor, as the ordinary user, on the spec: each profile's expected warning (accounting
    off, the nodes' clocks off, the node faults and oom-rank not for this user here) and the rest
    passing; its test job ran as the user."""
    done = _as_user(user, home, "doctor", str(spec), "--format", "json")
    document = json.loads(done.stdout)
    checks = {check["name"]: check for check in document["checks"]}
    assert done.returncode == 0 and document["summary"]["fail"] == 0, done.stdout[-4000:]
    assert checks["accounting"]["status"] == "warn" and "unknown" in checks["accounting"]["fix"], checks["accounting"]
    assert checks["clocks"]["status"] == "warn" and "fd-n1" in checks["clocks"]["detail"], checks["clocks"]
    [node_kinds] = [check for name, check in checks.items() if name.startswith("fault kinds: node")]
    assert node_kinds["status"] == "warn" and f"you are {user.name}, not root" in node_kinds["detail"], node_kinds
    oom = checks["fault kinds: oom-rank"]
    assert oom["status"] == "warn" and "not root" in oom["detail"], oom
    for name in ("test job", "nodes: python", "nodes: framework", "shared filesystem", "workdir: flock"):
        assert checks[name]["status"] == "pass", (name, checks[name])


# What one drill's phases vary by from the next on this cluster, whatever the clocks (a poll's
# timing, a busy core). A preemption's detection is left out: it waits for the ranks' save and then
# for the scheduler to show the cancelled job's end, a poll's interval that varies by seconds; what
# the skew could move in it is whether the ranks' warned checkpoint is found on rank 0's clock (1.6 s
# behind, past preempt's slack): its work lost (none) and its record ("ranks saved step ...").
PHASES_COMPARED = {"kill-rank": ("detect_s", "resubmit_s"), "preempt": ()}
PHASE_SPREAD_S = 0.5
LOST_STEPS_SPREAD = 5


def _measured_alike(skewed: dict[str, Any], one_clock: dict[str, Any]) -> None:
    """Each faulted run's recovery in the skewed drill against the same run's on one clock: the
    work lost, and each phase compared within the two drills' reported uncertainties and the spread."""
    for kind, phases in PHASES_COMPARED.items():
        [moved], [still] = ([run for run in report["runs"] if run["faults"] and run["faults"][0]["kind"] == kind]
                            for report in (skewed, one_clock))
        assert still["status"] == "completed" and still["identical_to_baseline"] is True, still["attempts"]
        [a], [b] = moved["recoveries"], still["recoveries"]
        assert abs(a["lost_steps"] - b["lost_steps"]) <= LOST_STEPS_SPREAD, (kind, a["lost_steps"], b["lost_steps"])
        for phase in phases:
            bound = sum(recovery["phase_uncertainty_s"].get(phase) or 0.0 for recovery in (a, b)) + PHASE_SPREAD_S
            assert abs(a[phase] - b[phase]) <= bound, (kind, phase, a[phase], b[phase], bound)
        if kind == "preempt":
            assert "ranks saved step" in moved["faults"][0]["detail"] and a["lost_steps"] == 0, moved["faults"]


def _limits_spec(shared_tmp: Path, runs: int, parallel_runs: int) -> Path:
    """``runs`` runs of one small config (so one shared twin, one of them), 1 rank each, all at once
    if the site allowed it: the first killed at step 40, the others fault-free."""
    faults: list[list[dict[str, Any]]] = [[{"kind": "kill-rank", "after": {"at_step": 40}, "rank": 0,
                                            "signal": "SIGKILL"}]] + [[] for _ in range(runs - 2)]
    spec: dict[str, Any] = {
        "name": "site-limits", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        # Framework-free ranks (the site's limits are drilled), 8 s of steps: the kill's agent, started
        # through srun as the rank registers (seconds on a loaded machine), waits for step 40 on the
        # node; at 10 ms a step the run had ended first (its fault "not fired", no recovery to check).
        "workload": api_workload(80, step_s=0.1),
        "checkpoint": {"every_steps": 20, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"},
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2},
        "baseline": True, "parallel_runs": parallel_runs, "submit_as_array": True,
        "sweep": {"grid": {"faults": faults}},
    }
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _sacct_spans(job_ids: list[str]) -> list[tuple[float, float]]:
    """Each job's submission and end, as Slurm's accounting has them (the scheduler's own count)."""
    listed = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,Submit,End", "-j", ",".join(job_ids)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    spans = []
    for line in listed.splitlines():
        fields = line.split("|")
        if len(fields) == 3 and "Unknown" not in fields[1:]:
            submitted, ended = (time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) for stamp in fields[1:])
            spans.append((submitted, ended))
    return spans


def test_under_the_sites_limits_a_sweep_keeps_to_its_submit_limit_and_completes(
        shared_tmp: Path, site_limits: dict[str, int], slurm, wait_until) -> None:
    """The limits profile: parallel_runs 100 (past the cap of 64 the spec had before issue 29)
    against MaxSubmitJobs 8 (each array element counts, so an array of ten is refused whole). The first eight runs go out as one array, the other two as
    single jobs as places free; by Slurm's own accounting never more than eight of the drill's jobs
    at once (a failed attempt's job counted until it ended); every run
    completes as its twin, its jobs' states read once they left squeue (MinJobAge 10 s); the report
    says why fewer than parallel_runs ran. The backend reads MaxArraySize 16 (parts of 16: the unit
    tests), the PBS backend under the wrappers the same limits; the doctor's limits check reads the
    profile and warns of parallel_runs."""
    from orchestrator.backends.pbs.backend import PBSBackend
    from orchestrator.backends.slurm.backend import SlurmBackend
    from orchestrator.doctor.slurm import scheduler_checks

    assert SlurmBackend("limits").max_array_size() == site_limits["MaxArraySize"]
    # The PBS backend through Slurm's Torque wrappers: its jobs are Slurm's, and so are its limits.
    pbs = PBSBackend("limits")
    found = pbs.max_submit_jobs(None, "debug")
    assert found is not None and found.jobs == site_limits["MaxSubmitJobs"], found
    assert pbs.max_array_size() == site_limits["MaxArraySize"]
    runs, parallel_runs = 10, 100
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill",
                           str(_limits_spec(shared_tmp, runs, parallel_runs)),
                           "--format", "json", "--no-html"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    attempts = [attempt for run in report["runs"] for attempt in run["attempts"]]
    for attempt in attempts:
        slurm.track(attempt["job_id"].split("_", 1)[0])
    assert len(report["runs"]) == runs
    for run in report["runs"]:
        assert run["status"] == "completed" and run["identical_to_baseline"] is not False, run["attempts"]
    killed = next(run for run in report["runs"] if run["faults"])
    assert len(killed["attempts"]) == 2 and killed["recoveries"][0]["failure_class"] == "RANK_SIGNAL"

    firsts = [run["attempts"][0]["job_id"] for run in report["runs"]]
    arrays = {job_id.split("_", 1)[0] for job_id in firsts if "_" in job_id}
    assert len(arrays) == 1 and sum("_" in job_id for job_id in firsts) == site_limits["MaxSubmitJobs"], firsts
    assert "(your association's MaxSubmitJobs: 8)" in " ".join(report["site_notes"]), report["site_notes"]
    job_ids = [attempt["job_id"] for attempt in attempts]
    spans = wait_until(lambda: (found := _sacct_spans(job_ids)) and len(found) == len(job_ids) and found,
                       timeout=60, message="sacct to hold every job's end")
    assert most_at_once(spans) <= site_limits["MaxSubmitJobs"], spans

    [limits] = [check for check in scheduler_checks(parallel_runs=parallel_runs) if check.name == "limits"]
    assert limits.status == "warn", limits
    for said in ("MaxArraySize 16", "MinJobAge 10", "MaxSubmitJobs 8 < parallel_runs 100"):
        assert said in limits.detail, limits


def test_the_users_other_jobs_count_too_a_refused_submission_is_held_until_they_end(
        shared_tmp: Path, site_limits: dict[str, int], slurm) -> None:
    """Review of issue 22: the held path had run only on recorded sbatch answers (the drill keeps to
    MaxSubmitJobs itself). Six jobs of the user's own hold six of its eight places for 20 s; a drill
    of four runs gets two of them, sbatch refuses the rest (AssocMaxSubmitJobLimit), and those are
    held, not failed, until places free: every run completes as its twin, no attempt's submission
    failed, and by Slurm's accounting never more than eight of the user's jobs at once."""
    fillers = [slurm.sbatch("-p", "debug", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 20")
               for _ in range(site_limits["MaxSubmitJobs"] - 2)]
    spec_path = _limits_spec(shared_tmp, runs=4, parallel_runs=4)
    spec = yaml.safe_load(spec_path.read_text())
    spec["submit_as_array"] = False
    spec_path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec_path), "--format", "json"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_S, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-4000:]
    assert "held by the site's limit of submitted jobs" in done.stderr, done.stderr[-4000:]
    report = json.loads(done.stdout)
    for run in report["runs"]:
        assert run["status"] == "completed", run["attempts"]
        assert all(attempt["state"] != "SUBMIT_FAILED" for attempt in run["attempts"]), run["attempts"]
        assert run["is_baseline"] or run["identical_to_baseline"] is True, run["run_id"]
    job_ids = [*fillers, *(attempt["job_id"] for run in report["runs"] for attempt in run["attempts"])]
    spans = wait_until(lambda: (found := _sacct_spans(job_ids)) and len(found) == len(job_ids) and found,
                       timeout=60, message="sacct to hold every job's end")
    assert most_at_once(spans) <= site_limits["MaxSubmitJobs"], spans


def _as_user(user: PlainUser, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``faultdrill ARGS`` run as ``user`` (runuser: no root left), HOME its own directory."""
    return subprocess.run(["runuser", "-u", user.name, "--", "env", f"HOME={home}", sys.executable, "-m",
                           "orchestrator.cli", *args], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S,
                          cwd=Path(__file__).resolve().parents[2])


def _owned_by(uid: int, roots: list[Path]) -> list[Path]:
    """Every path under ``roots`` that belongs to ``uid`` (never crossing into another filesystem)."""
    found = []
    for root in roots:
        listed = subprocess.run(["find", str(root), "-xdev", "-uid", str(uid)], capture_output=True, text=True,
                                timeout=120)
        found += [Path(line) for line in listed.stdout.splitlines()]
    return found


def _refused_at_plan(user: PlainUser, home: Path) -> None:
    """oom-rank and a node crash through scripts/cluster, refused at plan naming the user; nothing made."""
    spec = home / "refused.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "site-user-refused", "backend": "slurm", "workdir": str(home / "refused"),
        "workload": {"framework": "torch", "params": 1000, "steps": 80, "seed": 6},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"},
        "faults": [{"kind": "oom-rank", "after": {"at_step": 10}}, {"kind": "node-crash", "after": {"at_step": 20}}]}))
    os.chown(spec, user.uid, user.gid)
    refused = _as_user(user, home, "plan", str(spec))
    assert refused.returncode == 2, (refused.stdout, refused.stderr[-2000:])
    for said in ("faults[0] (oom-rank)", "faults[1] (node-crash)", f"you are {user.name}"):
        assert said in refused.stderr, refused.stderr[-2000:]
    assert not (home / "refused").exists(), "nothing is made for a refused drill"


def _nothing_outside(user: PlainUser, home: Path) -> None:
    """Nothing of ``user``'s lies outside ``home``: the shared filesystem, /tmp, /dev/shm, the
    nodes' private /tmp, the repository. Let be, as not the drill's: PyTorch's own at import (its
    inductor cache directory in the temporary directory, TMPDIR or the node's /tmp, per user), and
    the skew profile's libfaketime segments in /dev/shm (a SIGKILLed rank's; `skew off` removes them)."""
    roots = [SHARED_TMP_ROOT, Path("/tmp"), Path("/dev/shm"), Path(__file__).resolve().parents[2],
             *sorted((CLUSTER_STATE_DIR / "nodes").glob("*/tmp"))]
    framework_cache = f"torchinductor_{user.name}"
    strays = [found for found in _owned_by(user.uid, roots) if not found.is_relative_to(home)
              and framework_cache not in found.parts and not found.name.startswith(FAKETIME_SEGMENTS)]
    assert strays == [], strays


def test_under_slurms_memory_cgroup_an_ordinary_user_drills_oom_rank_and_slurm_ends_the_rank(
        shared_tmp: Path, plain_user: PlainUser, memory_cgroup: None) -> None:
    """Issue 22 item 4, the cgroup profile: where Slurm's task/cgroup confines a job's memory, oom-rank
    needs no root: fd-user's drill is planned, its rank made to outgrow the job's --mem (700 MB), and
    Slurm's own OOM handling ends it (the rank step OUT_OF_MEMORY in accounting). The attempt is
    OUT_OF_MEMORY, the run resumes from its checkpoint and ends as its twin; no cgroup was made.
    The profile's doctor: oom-rank acts here as fd-user (its test job's memory limit read)."""
    home = plain_user.own(shared_tmp / "home")
    spec = home / "oom.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "site-cgroup", "backend": "slurm", "workdir": str(home / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 300, "step_s": 0.02, "seed": 8, "batch_size": 16},
        "checkpoint": {"every_steps": 100, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug",
                      "extra_directives": ["--mem=700M"]},
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2}, "baseline": True,
        "faults": [{"kind": "oom-rank", "after": {"at_step": 120}}]}))
    os.chown(spec, plain_user.uid, plain_user.gid)
    done = _as_user(plain_user, home, "drill", str(spec), "--format", "json")
    assert done.returncode == 0, done.stderr[-4000:]
    [run] = [run for run in json.loads(done.stdout)["runs"] if run["faults"]]
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["attempts"]
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and "the job's memory limit (700 MB" in fault["detail"], (
        fault["outcome"], fault["detail"])
    failed = run["attempts"][0]
    assert failed["failure_class"] == "OUT_OF_MEMORY", failed
    steps = wait_until(lambda: _step_states(failed["job_id"]), timeout=60, message="the job's steps in accounting")
    assert "OUT_OF_MEMORY" in steps.values(), steps
    assert run["recoveries"][0]["resumed_from_step"] == 100, run["recoveries"]
    assert not list(Path("/sys/fs/cgroup/memory").rglob("faultdrill-oom-*")), "the agent made a cgroup of its own"
    doctor = _as_user(plain_user, home, "doctor", "--backend", "slurm", "--workdir", str(home / "doctor"), "--nodes", "1",
                      "--partition", "debug", "--format", "json")
    [oom] = [check for check in json.loads(doctor.stdout)["checks"] if check["name"] == "fault kinds: oom-rank"]
    assert oom["status"] == "pass" and "limits the test job's memory" in oom["detail"], oom


def _step_states(job_id: str) -> dict[str, str] | None:
    """The states of every step of ``job_id`` (accounting), once the rank step's is there."""
    listed = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State"], capture_output=True, text=True,
                            timeout=20)
    states = dict(line.split("|", 1) for line in listed.stdout.splitlines() if "|" in line)
    return states if any(step.endswith(".0") for step in states) else None
