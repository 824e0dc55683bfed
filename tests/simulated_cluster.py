"""A scheduler whose jobs run, in the controller's own process: each poll moves every job a step on and
writes what its batch script and ranks would (events, heartbeats, the final record), so that the
controller drives whole drills in the unit tier (no process, no framework). A job checks the run's
fence when it starts, as the batch script does (templates/fence.sh.j2): a stale one ends without
touching the run. The world outlives the controller: a test kills one (ControllerCrash at a seam)
and starts the next on the same workdir and the same scheduler.

What it records for the invariants of the crash-point harness: which jobs ever ran for each
attempt, which started against the fence (never allowed), and which are still alive."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_JOB_START,
    EVENT_STEP_EXIT,
    EVENT_WARM_FAILURE,
    EVENT_WARM_PLAN,
    FinalRecord,
    RankJob,
    RunPaths,
    append_json_line,
    record_dict,
    write_json_atomic,
)
from experiments.runtime.fence import Fence, read_fence, write_fence
from fake_scheduler import FakeScheduler
from orchestrator.backends.base import AttemptRef, Submission
from orchestrator.campaign.runs import RunConfig
from orchestrator.render.scripts import array_job_name, attempt_job_name
from orchestrator.states import JobState

KILL = "kill"  # the ranks die of SIGKILL at the job's second poll while running (launch exit 137)
HANG = "hang"  # the ranks stop at the job's second poll while running: no more heartbeats, the job runs on
PREEMPT = "preempt"  # the scheduler takes the job back at its second poll while running (PREEMPTED, no exit)


@dataclass
class SimJob:
    job_id: str
    run: RunConfig
    job: RankJob
    name: str = ""  # the scheduler's name of it (an array's, for an element), as the real backends give it
    running_polls: int = 0
    stale: bool = False  # started against the fence and ended without touching the run
    awaiting_go: bool = False  # in-allocation: its ranks died, the job waits for the controller's go
    re_forming: bool = False  # warm: a rank died; the job's coordinator re-forms at the next poll


@dataclass
class SimulatedCluster(FakeScheduler):
    polls_to_finish: int = 3  # polls a running job takes to train to its last step
    failures: dict[tuple[str, int], str] = field(default_factory=dict)  # (run id, attempt) -> KILL
    jobs: dict[str, SimJob] = field(default_factory=dict)
    ran: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # (run, attempt) -> jobs that trained
    began: dict[tuple[str, int], float] = field(default_factory=dict)  # (run, attempt) -> when its ranks started
    failed_at: dict[tuple[str, int], float] = field(default_factory=dict)  # (run, attempt) -> when it failed
    # (run, attempt, job) of a job found training while the fence named another attempt or job: never allowed
    against_fence: list[tuple[str, int, str]] = field(default_factory=list)

    def __getstate__(self) -> dict[str, object]:
        """The cluster's state, saved for the next controller process: without the test's wrappers
        around its methods (instance attributes, set by the crash-point harness)."""
        return {name: value for name, value in vars(self).items() if not callable(value)}

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        submission = super().submit(run, job)
        self.jobs[submission.job_id] = SimJob(submission.job_id, run, job,
                                              name=attempt_job_name(run, job.attempt, job.drill_id))
        return submission

    def submit_array(self, items: list[tuple[RunConfig, RankJob]], throttle: int | None = None) -> list[Submission]:
        submissions = super().submit_array(items, throttle)
        name = array_job_name([run for run, _ in items], items[0][1].attempt, items[0][1].drill_id)
        for (run, job), submission in zip(items, submissions, strict=True):
            self.jobs[submission.job_id] = SimJob(submission.job_id, run, job, name=name)
        return submissions

    def find_submitted(self, ref: AttemptRef) -> list[str]:
        """The jobs of ``ref``'s name (and array element), as squeue and sacct find them."""
        self._called("find_submitted", (ref.run.run_id, ref.attempt))
        return [sim.job_id for sim in self.jobs.values() if sim.name == ref.job_name
                and (ref.array_index is None or sim.job_id.endswith(f"_{ref.array_index}"))]

    def kill_rank_step(self, job_id: str, attempt: int, started_before: int) -> bool:
        """in-allocation: a hung attempt's launch ended alone; its job records the launch's exit and
        waits for the controller's go (templates/relaunch.sh.j2)."""
        self._called("kill_rank_step", (job_id, attempt))
        sim = self.jobs.get(job_id)
        if sim is None or self.states[job_id] is not JobState.RUNNING or sim.job.attempt != attempt:
            return False
        append_json_line(RunPaths(sim.run.paths.root).script_events_file(attempt),
                         {"event": EVENT_STEP_EXIT, "time": time.time(), "exit_code": 137})
        sim.awaiting_go = True
        return True

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """Every job moves on (the scheduler runs them all, asked about or not), then the answer."""
        self.tick()
        return super().poll(job_ids)

    def tick(self) -> None:
        """Time passes on the cluster: every job a step on (also while no controller watches)."""
        for sim in list(self.jobs.values()):
            self._advance(sim)

    def alive(self) -> list[str]:
        return [job_id for job_id, state in self.states.items() if not state.is_terminal]

    def _advance(self, sim: SimJob) -> None:
        state = self.states[sim.job_id]
        if state is JobState.PENDING:
            self._start(sim)
        elif state is JobState.RUNNING and sim.awaiting_go:
            self._await_go(sim)
        elif state is JobState.RUNNING and sim.re_forming:
            self._re_form(sim)
        elif state is JobState.RUNNING:
            self._train(sim)

    def _await_go(self, sim: SimJob) -> None:
        """templates/relaunch.sh.j2: the fence naming a later attempt and this job is the go; one
        naming another job ends this one."""
        fence = read_fence(RunPaths(sim.run.paths.root))
        if fence is None:
            return
        if fence.job_id == sim.job_id and fence.attempt > sim.job.attempt:
            sim.job, sim.running_polls, sim.awaiting_go = replace(sim.job, attempt=fence.attempt), 0, False
            self._begin(sim)
        elif fence.job_id is not None and fence.job_id != sim.job_id:
            self.states[sim.job_id] = JobState.COMPLETED

    def _re_form(self, sim: SimJob) -> None:
        """experiments/warm/coordinator.py: the next generation is the run's next attempt, fenced by
        compare-and-set over the fence the job holds (one that names anything else ends the job:
        the controller has moved on), then its plan, then its ranks train (a spare took the dead one)."""
        paths = RunPaths(sim.run.paths.root)
        held = Fence(sim.job.attempt, sim.job_id, sim.job.drill_id or None)
        fence = read_fence(paths)
        if fence is None or (fence.attempt, fence.job_id) != (held.attempt, held.job_id):
            self.states[sim.job_id] = JobState.COMPLETED
            return
        attempt = sim.job.attempt + 1
        write_fence(paths, Fence(attempt, sim.job_id, held.drill_id))
        sim.job, sim.running_polls, sim.re_forming = replace(sim.job, attempt=attempt), 0, False
        events = paths.coordinator_events_file(attempt)
        events.parent.mkdir(parents=True, exist_ok=True)
        append_json_line(events, {"event": EVENT_WARM_PLAN, "time": time.time(), "generation": attempt,
                                  "resume": "peer", "source_rank": 0, "step": 2})
        self._begin(sim, job_start=False)

    def _start(self, sim: SimJob) -> None:
        paths = RunPaths(sim.run.paths.root)
        fence = read_fence(paths)
        if (sim.run.campaign.restart.strategy == "requeue" and fence is not None and fence.job_id == sim.job_id
                and fence.attempt > sim.job.attempt):
            # templates/slurm.sbatch.j2: a requeued job runs as the attempt the fence names for it
            sim.job, sim.running_polls = replace(sim.job, attempt=fence.attempt), 0
        if fence is None or not fence.admits(sim.job.attempt, sim.job_id, sim.job.drill_id or None):
            sim.stale = True  # the batch script's fence check: no rank started, nothing written
            self.states[sim.job_id] = JobState.COMPLETED
            return
        self.states[sim.job_id] = JobState.RUNNING
        self._begin(sim)

    def _begin(self, sim: SimJob, job_start: bool = True) -> None:
        """Its ranks start as ``sim.job``'s attempt: the batch script's and rank 0's first records."""
        paths = RunPaths(sim.run.paths.root)
        self.ran.setdefault((sim.run.run_id, sim.job.attempt), []).append(sim.job_id)
        events = paths.events_file(sim.job.attempt)
        events.parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.began.setdefault((sim.run.run_id, sim.job.attempt), now)
        if job_start:
            append_json_line(paths.script_events_file(sim.job.attempt), {"event": EVENT_JOB_START, "time": now})
        append_json_line(events, {"event": EVENT_FIRST_STEP, "time": now, "step": 1})
        paths.heartbeats.mkdir(parents=True, exist_ok=True)
        append_json_line(paths.heartbeat_file(sim.job.attempt, 0), {"attempt": sim.job.attempt, "step": 1, "time": now})

    def _train(self, sim: SimJob) -> None:
        paths = RunPaths(sim.run.paths.root)
        failure = self.failures.get((sim.run.run_id, sim.job.attempt))
        if failure == HANG and sim.running_polls >= 1:
            return  # stopped: silent until the scheduler ends it
        fence = read_fence(paths)
        if fence is None or not fence.admits(sim.job.attempt, sim.job_id, sim.job.drill_id or None):
            # Its ranks would be refused at their next checkpoint; that it trains at all is the fault.
            self.against_fence.append((sim.run.run_id, sim.job.attempt, sim.job_id))
            sim.stale = True
            self.states[sim.job_id] = JobState.COMPLETED
            return
        sim.running_polls += 1
        now = time.time()
        append_json_line(paths.heartbeat_file(sim.job.attempt, 0), {"attempt": sim.job.attempt, "step": 1 + sim.running_polls,
                                                   "time": now})
        if failure in (PREEMPT, KILL) and sim.running_polls == 2:
            self.failed_at[(sim.run.run_id, sim.job.attempt)] = now
        if failure == PREEMPT and sim.running_polls == 2:
            self.states[sim.job_id] = JobState.PREEMPTED
        elif failure == KILL and sim.running_polls == 2 and sim.run.campaign.restart.strategy == "warm":
            # A rank's own step ended; the job's coordinator saw it and re-forms at the next poll.
            append_json_line(paths.coordinator_events_file(sim.job.attempt), {"event": EVENT_WARM_FAILURE, "time": now,
                                                                  "rank": 0, "exit_code": 137})
            sim.re_forming = True
        elif failure == KILL and sim.running_polls == 2:
            append_json_line(paths.script_events_file(sim.job.attempt), {"event": EVENT_STEP_EXIT, "time": now,
                                                                  "exit_code": 137})
            if sim.run.campaign.restart.strategy == "in-allocation":
                sim.awaiting_go = True  # the job keeps its allocation for the controller's go
            else:
                self.states[sim.job_id] = JobState.FAILED
        elif sim.running_polls >= self.polls_to_finish:
            steps = sim.run.workload.steps
            write_json_atomic(paths.final, record_dict(FinalRecord(step=steps, digest=f"digest-{sim.run.run_id}",
                                                                   time=now, attempt=sim.job.attempt)))
            append_json_line(paths.events_file(sim.job.attempt), {"event": EVENT_COMPLETED, "time": now})
            append_json_line(paths.script_events_file(sim.job.attempt), {"event": EVENT_STEP_EXIT, "time": now,
                                                                  "exit_code": 0})
            self.states[sim.job_id] = JobState.COMPLETED
