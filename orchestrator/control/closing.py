"""Failed attempts' jobs until the scheduler reports them ended: their final state recorded, and a
job that does not end escalated — cancelled, then killed, then left behind with a warning — so that
one unkillable job never keeps a drill alive."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from orchestrator.record.ledger import Ledger
from orchestrator.states import JobState

log = logging.getLogger(__name__)


@dataclass
class ClosingJob:
    job_id: str
    since: float  # the last escalation (the failure, the cancel, the forced cancel)
    cancelled: bool
    forced: bool = False
    state: JobState = JobState.RUNNING  # the scheduler's last word on it


class ClosingJobs:
    def __init__(self, run_id: str, ledger: Ledger, cancel: Callable[[int, str, bool], None], timeout_s: float,
                 on_final_state: Callable[[int, JobState], None] | None = None) -> None:
        self.run_id, self.ledger, self.cancel, self.timeout_s = run_id, ledger, cancel, timeout_s
        self.on_final_state = on_final_state
        self.jobs: dict[int, ClosingJob] = {}  # attempt -> its job

    def __bool__(self) -> bool:
        return bool(self.jobs)

    @property
    def job_ids(self) -> list[str]:
        return [closing.job_id for closing in self.jobs.values()]

    def add(self, attempt: int, job_id: str, now: float, cancelled: bool, state: JobState = JobState.RUNNING) -> None:
        self.jobs[attempt] = ClosingJob(job_id, now, cancelled, state=state)

    def settle(self, states: dict[str, JobState], now: float) -> None:
        for attempt, closing in list(self.jobs.items()):
            state = states.get(closing.job_id, closing.state)  # no poll this round: the last word stands
            closing.state = state
            if state.is_terminal or state is JobState.UNKNOWN:
                self.ledger.update_attempt(self.run_id, attempt, state=state.value)
                del self.jobs[attempt]
                if self.on_final_state is not None:
                    self.on_final_state(attempt, state)
            elif now - closing.since > self.timeout_s:
                self._escalate(attempt, closing, state, now)

    def _escalate(self, attempt: int, closing: ClosingJob, state: JobState, now: float) -> None:
        if not closing.cancelled:
            closing.cancelled = True
            self.cancel(attempt, closing.job_id, False)
        elif not closing.forced:
            closing.forced = True
            log.warning("%s: job %s still %s after its cancel; killing it", self.run_id, closing.job_id, state.value)
            self.cancel(attempt, closing.job_id, True)
        else:
            row = next(row for row in self.ledger.attempts(self.run_id) if row.attempt == attempt)
            note = f"job still {state.value} after a forced cancel: left behind"
            self.ledger.update_attempt(self.run_id, attempt, state=state.value,
                                       reason=f"{row.reason}; {note}" if row.reason else note)
            log.warning("%s: job %s %s", self.run_id, closing.job_id, note)
            del self.jobs[attempt]
            return
        closing.since = now
