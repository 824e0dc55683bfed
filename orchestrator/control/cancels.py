"""The drill's own cancels of a run's jobs. Each is journaled first — ``ended_by_drill`` in the
ledger with the failure that led to it — and then asked of the scheduler, so that the job's
CANCELLED is never taken for a person's, by this controller or by one started after it died. A job
so journaled whose end no controller saw is cancelled again by the next (``RunTracker.reclaim_cancels``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Callable

from experiments.layout import RankJob
from orchestrator.backends.base import AttemptRef, Backend
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.failure_classes import DrillEnded
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError
from orchestrator.control.submission import SUBMIT_FAILED
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.states import TERMINAL_STATE_NAMES

log = logging.getLogger(__name__)


class DrillCancels:
    def __init__(self, run_id: str, ledger: Ledger, backend: Backend, calls: SchedulerCalls | None = None) -> None:
        self.run_id, self.ledger, self.backend = run_id, ledger, backend
        self.calls = calls or SchedulerCalls(off_loop=False)
        self.ended_by_drill: dict[str, DrillEnded] = {  # job id -> why the drill ended it
            row.job_id: DrillEnded(**json.loads(row.ended_by_drill)) for row in ledger.attempts(run_id)
            if row.job_id and row.ended_by_drill}

    def why(self, job_id: str | None) -> DrillEnded | None:
        return self.ended_by_drill.get(job_id) if job_id is not None else None

    def journaled(self, attempt: int, job_id: str, why: DrillEnded, force: bool = False) -> None:
        """Cancel ``attempt``'s job as the drill's: recorded first, then asked."""
        self.journal(attempt, job_id, why)
        self.ask(job_id, force)

    def journal(self, attempt: int, job_id: str, why: DrillEnded) -> None:
        """The intent alone (the caller's transaction may hold more), its ``ask`` to follow."""
        self._record(attempt, job_id, why, self.ledger)

    def from_thread(self, attempt: int, job_id: str, why: DrillEnded) -> None:
        """``journaled``, for a thread (a hung launch's end): recorded through a ledger connection of
        its own (the loop's may not be used from here; sqlite takes one writer at a time), then
        asked, even when the record could not be written (this controller knows why)."""
        try:
            ledger = Ledger(self.ledger.path)
            try:
                self._record(attempt, job_id, why, ledger)
            finally:
                ledger.close()
        except Exception as error:
            self.ended_by_drill.setdefault(job_id, why)
            log.warning("%s: journaling the cancel of job %s failed (%s); cancelling it anyway", self.run_id, job_id,
                        error)
        self.ask(job_id)

    def ask(self, job_id: str, force: bool = False) -> None:
        """The scheduler asked to end the job, off the controller's loop (scheduler_calls); a
        refusal is logged (whoever follows the job to its end asks again)."""
        asked = self.calls.start(lambda: self.backend.cancel(job_id, force=force))
        asked.add_done_callback(lambda done: self._refused(job_id, done.exception()))

    def _refused(self, job_id: str, error: BaseException | None) -> None:
        if isinstance(error, CommandError):
            log.warning("%s: cancelling job %s failed (tried again if it does not end): %s", self.run_id, job_id,
                        error.summary)
        elif error is not None:
            log.warning("%s: cancelling job %s failed: %s", self.run_id, job_id, error)

    def _record(self, attempt: int, job_id: str, why: DrillEnded, ledger: Ledger) -> None:
        if job_id not in self.ended_by_drill:
            ledger.update_attempt(self.run_id, attempt, ended_by_drill=json.dumps(asdict(why)))
            self.ended_by_drill[job_id] = why


def cancel_every_job(run: RunConfig, rows: list[AttemptRow], backend: Backend,
                     rank_job: Callable[[int], RankJob]) -> tuple[list[str], list[str]]:
    """``faultdrill cancel``, first half, for one run: every job of its attempts that may still
    run — recorded, or looked up by the attempt's name when no controller saw its submission
    answered — is adopted (an earlier controller's) and the scheduler asked to cancel it, at once
    (the person waits for the answer). The jobs asked, and those whose cancel could not be asked
    or confirmed (a refused scancel, a look-up that failed: their runs are not recorded cancelled)."""
    asked, refused = [], []
    for row in rows:
        if row.state in TERMINAL_STATE_NAMES or row.state == SUBMIT_FAILED:
            continue
        try:
            job_ids = [row.job_id] if row.job_id is not None else _submitted_unrecorded(run, row, backend)
        except CommandError as error:  # its job may run: the cancel cannot be confirmed
            unknown = f"{row.job_name} (attempt {row.attempt}, not looked up: {error.summary})"
            asked.append(unknown)
            refused.append(unknown)
            continue
        for job_id in job_ids:
            backend.adopt(job_id, run, rank_job(row.attempt))
            try:
                backend.cancel(job_id)
            except CommandError as error:
                log.warning("%s: cancelling job %s failed: %s", run.run_id, job_id, error.summary)
                refused.append(job_id)
            asked.append(job_id)
    return asked, refused


def _submitted_unrecorded(run: RunConfig, row: AttemptRow, backend: Backend) -> list[str]:
    """The jobs of an attempt whose submission no controller saw answered (it stopped or died
    while sbatch ran): looked up by the attempt's name, as a restarted controller would."""
    if row.ended is not None:
        return []
    return backend.find_submitted(AttemptRef(run, row.attempt, row.job_name, row.array_index, row.submitted))
