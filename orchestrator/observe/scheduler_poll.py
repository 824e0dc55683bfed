"""The scheduler is the slow path: one batched poll for all the drill's jobs at a respectful interval
(sites rate-limit squeue/sacct from login nodes), while the controller reads events and heartbeats
at its fast interval. A poll comes early only when a run's own files say the scheduler has news
(a rank step ended, the final record is written), and never more often than URGENT_MIN_S. A slow
scheduler stretches the interval; one that fails is retried with a growing wait until
restart.scheduler_timeout_s, its jobs' states unknown meanwhile (never failure, never success).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from orchestrator.commands import CommandError, commands_run_here
from orchestrator.states import JobState

log = logging.getLogger(__name__)

URGENT_MIN_S = 1.0  # at most one early poll per this interval
SLOW_FACTOR = 10.0  # a poll that took d seconds waits at least SLOW_FACTOR * d for the next
MAX_INTERVAL_S = 60.0  # a slow scheduler stretches the interval up to this (or the spec's interval, if longer)
FAILED_RETRY_MAX_S = 30.0


class Scheduler(Protocol):
    """What the poller needs of a backend."""

    name: str

    def poll(self, job_ids: list[str]) -> dict[str, JobState]: ...


class SchedulerUnavailable(RuntimeError):
    """The scheduler has not answered for longer than restart.scheduler_timeout_s."""


@dataclass
class PollStats:
    calls: int = 0  # batched polls made (each one squeue, plus sacct for forgotten ids)
    commands: int = 0  # the scheduler commands those polls ran (squeue, sacct, qstat; retries too)
    failures: int = 0
    seconds: float = 0.0  # wall time spent waiting on the scheduler


@dataclass
class SchedulerPoller:
    interval_s: float  # the respectful interval (0: every round, for a backend whose poll is free)
    timeout_s: float  # unanswered this long: SchedulerUnavailable
    stats: PollStats = field(default_factory=PollStats)
    # Scheduling and deadlines on the monotonic clock: a step of the wall clock (NTP) neither ends
    # the drill as a silence nor stops the polls. The wall clock only dates the answers.
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    # A real scheduler is asked from a thread of its own: a squeue that hangs (slurmctld gone: 9 s
    # per try) never holds up the fast path. A free one (the local backend) is asked inline.
    background: bool = False
    _next_at: float = 0.0
    _last_at: float = float("-inf")
    _failing_since: float | None = None
    _failures_in_row: int = 0
    _in_flight: Future[tuple[dict[str, JobState], int]] | None = None
    _in_flight_since: float = 0.0
    _in_flight_asked_at: float = 0.0  # the wall clock's time of that ask
    _executor: ThreadPoolExecutor | None = None
    # When the poll whose answer was last returned was asked: a job's state from before its
    # attempt was accepted (a requeued job's old FAILED) says nothing about that attempt.
    answered_as_of: float = 0.0

    def due(self, now: float, urgent: bool) -> bool:
        if now >= self._next_at:
            return True
        return urgent and self._failing_since is None and now - self._last_at >= URGENT_MIN_S

    def poll(self, backend: Scheduler, job_ids: list[str] | Callable[[], list[str]],
             urgent: bool = False) -> dict[str, JobState]:
        """The states of ``job_ids`` when an answer is in (a poll was due, or news is waiting), else
        {}: a job missing from the answer has no news this round. Raises SchedulerUnavailable once
        the scheduler has been silent past restart.scheduler_timeout_s. ``job_ids`` may be a
        function that lists them, called only when a poll is due (a sweep's 10,000 waiting
        elements are not listed every round)."""
        now = self.clock()
        if self._in_flight is not None:
            return self._collect(backend.name, now)
        if not self.due(now, urgent):
            return {}
        if callable(job_ids):
            job_ids = job_ids()
        if not job_ids:
            return {}
        self._in_flight_since, self._in_flight_asked_at = now, self.wall()
        if not self.background:
            self._in_flight = _run_now(backend, job_ids)
            return self._collect(backend.name, now)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-poll")
        self._in_flight = self._executor.submit(_counted_poll, backend, job_ids)
        return {}

    def _collect(self, scheduler: str, now: float) -> dict[str, JobState]:
        future, started = self._in_flight, self._in_flight_since
        assert future is not None
        if not future.done():
            silent_since = self._failing_since if self._failing_since is not None else started
            if now - silent_since > self.timeout_s:
                raise SchedulerUnavailable(self._silent_message(scheduler, now - silent_since, "a poll still waits"))
            return {}
        self._in_flight = None
        took = max(0.0, self.clock() - started)
        self.stats.calls += 1
        self.stats.seconds += took
        try:
            states, commands = future.result()
        except CommandError as error:
            self._failed(scheduler, error, started)
            return {}
        self.stats.commands += commands
        self._failing_since, self._failures_in_row = None, 0
        self._last_at, self.answered_as_of = started, self._in_flight_asked_at
        self._next_at = started + min(max(MAX_INTERVAL_S, self.interval_s), max(self.interval_s, SLOW_FACTOR * took))
        return states

    def close(self) -> None:
        """A poll still in flight is abandoned (its command ends at its own timeout)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _silent_message(self, scheduler: str, silent: float, last: str) -> str:
        return (f"the scheduler ({scheduler}) has not answered for {silent:.0f} s "
                f"(restart.scheduler_timeout_s = {self.timeout_s:g}); the drill stops here and its jobs are "
                f"left as they are: run the same drill again to pick them up, or cancel them. Last error: {last}")

    def _failed(self, scheduler: str, error: CommandError, started: float) -> None:
        self.stats.failures += 1
        self._failures_in_row += 1
        if self._failing_since is None:
            self._failing_since = started
        silent = self.clock() - self._failing_since
        if silent > self.timeout_s:
            raise SchedulerUnavailable(self._silent_message(scheduler, silent, error.summary)) from error
        now = self.clock()
        wait = min(FAILED_RETRY_MAX_S, max(self.interval_s, 0.5) * 2 ** (self._failures_in_row - 1),
                   max(0.0, self._failing_since + self.timeout_s - now) + 0.01)
        self._next_at = now + wait
        log.warning("scheduler poll failed (%d in a row); states unknown, next try in %.1f s: %s",
                    self._failures_in_row, wait, error.summary)


def _counted_poll(backend: Scheduler, job_ids: list[str]) -> tuple[dict[str, JobState], int]:
    """The poll's states and the number of scheduler commands it ran (on this thread)."""
    before = commands_run_here()
    states = backend.poll(job_ids)
    return states, commands_run_here() - before


def _run_now(backend: Scheduler, job_ids: list[str]) -> Future[tuple[dict[str, JobState], int]]:
    """The poll made here and now, as a finished future (the inline path shares the collection)."""
    future: Future[tuple[dict[str, JobState], int]] = Future()
    try:
        future.set_result(_counted_poll(backend, job_ids))
    except CommandError as error:
        future.set_exception(error)
    return future
