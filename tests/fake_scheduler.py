"""A scheduler that records every call the controller makes and answers from a table: for unit tests
of the controller's side effects (no process, no cluster). Jobs stay where the test puts them; a
call named in ``refuse`` raises CommandError as a scheduler that said no."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_JOB_START,
    EVENT_STEP_EXIT,
    FinalRecord,
    RankJob,
    RunPaths,
    append_json_line,
    record_dict,
    write_json_atomic,
)
from orchestrator.backends.base import AttemptRef, Backend, Submission, SubmitLimit
from orchestrator.campaign.capabilities import SLURM
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError, CommandResult
from orchestrator.states import JobState


class ControllerCrash(BaseException):
    """The controller's process ends here (a SIGKILL, a dropped session): nothing after it runs."""


@dataclass
class FakeScheduler(Backend):
    name: str = "slurm"
    max_array: int = 1001
    max_submit: int | None = None  # the user's limit of submitted jobs (MaxSubmitJobs), where the site says
    refuse: set[str] = field(default_factory=set)  # calls that fail: "submit", "submit_array", "cancel", ...
    crash_after: set[str] = field(default_factory=set)  # calls after whose effect the controller dies
    crash_before: set[str] = field(default_factory=set)  # calls the controller dies right before
    calls: list[tuple[str, Any]] = field(default_factory=list)
    states: dict[str, JobState] = field(default_factory=dict)
    throttles: list[int | None] = field(default_factory=list)  # each submit_array's, in order
    _next_id: int = 100

    capabilities = SLURM
    poll_interval_s = 0.0
    slow_commands = False  # its calls run inline: the tests see them in the order the controller made them

    def _called(self, name: str, what: Any) -> None:
        self.calls.append((name, what))
        if name in self.refuse:
            raise CommandError([name], 1, "", f"{name}: refused by the test", "command failed")

    def _new_job(self) -> str:
        self._next_id += 1
        self.states[str(self._next_id)] = JobState.PENDING
        return str(self._next_id)

    def called(self, name: str) -> list[Any]:
        return [what for call, what in self.calls if call == name]

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        self._called("submit", (run.run_id, job.attempt))
        return Submission(self._new_job(), time.time())

    def submit_array(self, items: list[tuple[RunConfig, RankJob]], throttle: int | None = None) -> list[Submission]:
        self._called("submit_array", [run.run_id for run, _ in items])
        self.throttles.append(throttle)
        self._next_id += 1  # the array's own id names no job of its own: its elements are the jobs
        array = str(self._next_id)
        elements = [f"{array}_{index}" for index in range(len(items))]
        self.states.update(dict.fromkeys(elements, JobState.PENDING))
        return [Submission(element, time.time()) for element in elements]

    def max_array_size(self) -> int:
        return self.max_array

    def max_submit_jobs(self, qos: str | None = None, queue: str | None = None) -> SubmitLimit | None:
        return None if self.max_submit is None else SubmitLimit(self.max_submit, "the test's MaxSubmitJobs")

    def find_submitted(self, ref: AttemptRef) -> list[str]:
        self._called("find_submitted", (ref.run.run_id, ref.attempt))
        return []

    def adopt(self, job_id: str, run: RunConfig, job: RankJob) -> None:
        self._called("adopt", job_id)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        self._called("poll", list(job_ids))
        return {job_id: self.states.get(job_id, JobState.UNKNOWN) for job_id in job_ids}

    def cancel(self, job_id: str, force: bool = False) -> None:
        if "cancel" in self.crash_before:
            self.crash_before.discard("cancel")
            raise ControllerCrash("the controller died right before its cancel")
        self._called("cancel", job_id)
        self.states[job_id] = JobState.CANCELLED
        self._maybe_crash("cancel")

    def requeue(self, job_id: str) -> None:
        self._called("requeue", job_id)
        self.states[job_id] = JobState.PENDING

    def kill_rank_step(self, job_id: str, attempt: int, started_before: int) -> bool:
        self._called("kill_rank_step", (job_id, attempt))
        return True

    def _maybe_crash(self, name: str) -> None:
        if name in self.crash_after:
            self.crash_after.discard(name)
            raise ControllerCrash(f"the controller died right after {name}")

    def run_agent(self, job_id: str, node: str, argv: list[str], timeout_s: float) -> CommandResult:
        raise AssertionError("no fault agent in these tests")


def launch_exited(run_dir: Any, attempt: int, exit_code: int) -> None:
    """What the batch script records when its rank launch returns (templates/events.sh.j2)."""

    events = RunPaths(run_dir).script_events_file(attempt)
    events.parent.mkdir(parents=True, exist_ok=True)
    append_json_line(events, {"event": EVENT_JOB_START, "time": time.time() - 1.0})
    append_json_line(events, {"event": EVENT_STEP_EXIT, "time": time.time(), "exit_code": exit_code})


def rank_fell_silent(run_dir: Any, attempt: int, silent_s: float) -> None:
    """Rank 0 of ``attempt`` took its first step and then nothing for ``silent_s`` (a hang)."""

    paths = RunPaths(run_dir)
    paths.events_file(attempt).parent.mkdir(parents=True, exist_ok=True)
    paths.heartbeats.mkdir(parents=True, exist_ok=True)
    then = time.time() - silent_s
    append_json_line(paths.script_events_file(attempt), {"event": EVENT_JOB_START, "time": then - 1.0})
    append_json_line(paths.events_file(attempt), {"event": EVENT_FIRST_STEP, "time": then, "step": 1})
    append_json_line(paths.heartbeat_file(attempt, 0), {"attempt": attempt, "step": 1, "time": then})


def run_completed(run_dir: Any, attempt: int, steps: int) -> None:
    """Rank 0 of ``attempt`` reached the last step: its final record and its completed event."""

    paths = RunPaths(run_dir)
    paths.events_file(attempt).parent.mkdir(parents=True, exist_ok=True)
    append_json_line(paths.script_events_file(attempt), {"event": EVENT_JOB_START, "time": time.time() - 2.0})
    write_json_atomic(paths.final, record_dict(FinalRecord(step=steps, digest="d", time=time.time(), attempt=attempt)))
    append_json_line(paths.events_file(attempt), {"event": EVENT_COMPLETED, "time": time.time()})


def when_first_job_runs(scheduler: FakeScheduler, act: Callable[[str], None]) -> Callable[[list[Any], list[Any]], None]:
    """An observer for ``Controller.run``: the first time the drill's first job is pending, it starts
    running and ``act(job)`` happens to it (its ranks die, hang or finish); never again (a requeue
    puts it back in the queue)."""
    acted: list[str] = []

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        job = next(iter(scheduler.states), None)
        if job is not None and not acted and scheduler.states[job] is JobState.PENDING:
            acted.append(job)
            scheduler.states[job] = JobState.RUNNING
            act(job)

    return observe
