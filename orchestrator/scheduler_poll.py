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
from dataclasses import dataclass, field
from typing import Callable, Protocol

from orchestrator.commands import CommandError
from orchestrator.states import JobState

log = logging.getLogger(__name__)

URGENT_MIN_S = 1.0  # at most one early poll per this interval
SLOW_FACTOR = 10.0  # a poll that took d seconds waits at least SLOW_FACTOR * d for the next
MAX_INTERVAL_S = 60.0
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
    failures: int = 0
    seconds: float = 0.0  # wall time spent waiting on the scheduler


@dataclass
class SchedulerPoller:
    interval_s: float  # the respectful interval (0: every round, for a backend whose poll is free)
    timeout_s: float  # unanswered this long: SchedulerUnavailable
    stats: PollStats = field(default_factory=PollStats)
    clock: Callable[[], float] = time.time
    _next_at: float = 0.0
    _last_at: float = float("-inf")
    _failing_since: float | None = None
    _failures_in_row: int = 0

    def due(self, now: float, urgent: bool) -> bool:
        if now >= self._next_at:
            return True
        return urgent and self._failing_since is None and now - self._last_at >= URGENT_MIN_S

    def poll(self, backend: Scheduler, job_ids: list[str], urgent: bool = False) -> dict[str, JobState]:
        """The states of ``job_ids`` if a poll is due (or news is waiting), else {}: a job missing
        from the answer has no news this round. Raises SchedulerUnavailable past the deadline."""
        now = self.clock()
        if not job_ids or not self.due(now, urgent):
            return {}
        try:
            states = backend.poll(job_ids)
        except CommandError as error:
            self._failed(backend.name, error, now)
            return {}
        finally:
            took = max(0.0, self.clock() - now)
            self.stats.calls += 1
            self.stats.seconds += took
        self._failing_since, self._failures_in_row = None, 0
        self._last_at = now
        self._next_at = now + min(MAX_INTERVAL_S, max(self.interval_s, SLOW_FACTOR * took))
        return states

    def _failed(self, scheduler: str, error: CommandError, now: float) -> None:
        self.stats.failures += 1
        self._failures_in_row += 1
        if self._failing_since is None:
            self._failing_since = now
        silent = now - self._failing_since
        if silent > self.timeout_s:
            raise SchedulerUnavailable(
                f"the scheduler ({scheduler}) has not answered for {silent:.0f} s "
                f"(restart.scheduler_timeout_s = {self.timeout_s:g}); the drill stops here and its jobs are "
                f"left as they are: run the same drill again to pick them up, or cancel them. "
                f"Last error: {error.summary}"
            ) from error
        wait = min(FAILED_RETRY_MAX_S, max(self.interval_s, 0.5) * 2 ** (self._failures_in_row - 1),
                   max(0.0, self._failing_since + self.timeout_s - now) + 0.01)
        self._next_at = now + wait
        log.warning("scheduler poll failed (%d in a row); states unknown, next try in %.1f s: %s",
                    self._failures_in_row, wait, error.summary)
