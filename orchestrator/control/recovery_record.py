"""A run's recoveries, recorded as soon as they can be measured: the attempt that recovers from a
failure is watched until its first step (and the fault that caused the failure has settled), then
its time to recover and the work lost go into the ledger (orchestrator.record.recovery)."""

from __future__ import annotations

from time import monotonic
from typing import Callable

from orchestrator.campaign.runs import RunConfig
from orchestrator.control.submission import SUBMIT_FAILED
from orchestrator.faults.book import FaultBook
from orchestrator.record.clocks import LOGIN
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.record.recovery import Failure, compute_recovery, recovering_from
from orchestrator.record.stamps import batch_host, evidence_clock, fault_clock

RETRY_S = 2.0


class RecoveryRecorder:
    def __init__(self, run: RunConfig, ledger: Ledger, faults: FaultBook,
                 clocks_pending: Callable[[int], bool] = lambda attempt: False,
                 events_read: Callable[[int], int | None] = lambda attempt: None) -> None:
        self.run, self.ledger, self.faults = run, ledger, faults
        self.clocks_pending = clocks_pending  # an attempt's node clocks are being read: its moments wait
        # The events the watch of an attempt has taken in (None: no watch on it). A recovery is
        # measured from the attempt's events once they hold its first step (and from the ledger's
        # rows): until one of those moves, another try finds what the last one found, and a round
        # does not read the ledger's attempts and every attempt's events again (issue 29).
        self.events_read = events_read
        self.awaiting: int | None = None  # the attempt whose recovery is not recorded yet
        self._tried: tuple[object, ...] | None = None  # what the last try that recorded nothing saw
        self._tried_at = 0.0

    def expect(self, attempt: int) -> None:
        """``attempt`` is watched from now on: a recovery if an earlier attempt ran (and failed). A
        recovery still awaited (its clocks being read) is recorded first, with the clocks read so far."""
        self.record(force=True)
        ran_before = any(row.attempt < attempt and ran(row) for row in self.ledger.attempts(self.run.run_id))
        self.awaiting = attempt if ran_before else None

    def record(self, force: bool = False) -> None:
        """The awaited recovery, once its attempt has taken its first step and its fault settled, and
        (unless ``force``: the run ends, or its next attempt comes) its nodes' clocks are read."""
        attempt = self.awaiting
        if attempt is None or (not force and not self._news(attempt)):
            return
        rows = {row.attempt: row for row in self.ledger.attempts(self.run.run_id)}
        attempts_that_ran = sorted(n for n, row in rows.items() if n < attempt and ran(row))
        if not attempts_that_ran:
            return
        failed = recovering_from(self.run.paths, attempts_that_ran)
        if not self.faults.settled(failed):
            return
        if not force and (self.clocks_pending(failed) or self.clocks_pending(attempt)):
            return
        failure = self.failure_of(rows[failed])
        if failure is None:
            return
        between = sum(1 for n in attempts_that_ran if n > failed)
        recovery = compute_recovery(self.run.paths, failure, rows[failed], rows[attempt], self.run.ranks, between)
        if recovery is not None:
            self.ledger.add_recovery(recovery)
            self.awaiting = None

    def _news(self, attempt: int) -> bool:
        """Something a try reads moved since the last try (the attempt's events, the run's ledger
        rows, an attempt's clocks read), or RETRY_S passed (a safety net: nothing it reads is
        missed for longer)."""
        seen = (self.events_read(attempt), self.ledger.writes(self.run.run_id),
                tuple(self.clocks_pending(n) for n in range(attempt + 1)))
        now = monotonic()
        if seen == self._tried and now - self._tried_at < RETRY_S:
            return False
        self._tried, self._tried_at = seen, now
        return True

    def failure_of(self, row: AttemptRow) -> Failure | None:
        """Why the attempt ended: the injected fault that hit it, else a natural failure."""
        if row.detected is None:
            return None
        # warm: a failure followed in its job is detected when the coordinator stamped it (its host)
        warm_stamped = row.failure_evidence == "warm" and row.detected == row.failed_at
        detected_clock = batch_host(self.run.paths, row.attempt) if warm_stamped else LOGIN
        fault = self.faults.credited(row.attempt)
        if fault is not None and fault.at is not None:
            return Failure(kind=fault.kind, at=fault.at, detected=row.detected, evidence="fault",
                           clock=fault_clock(fault.kind, fault.node), detected_clock=detected_clock)
        kind = (row.reason or "failure").split(":")[0]
        evidence = row.failure_evidence or "detection"
        if row.failed_at is None:  # no moment of its own: its detection (compute_recovery takes the earlier)
            return Failure(kind=f"natural ({kind})", at=row.detected, detected=row.detected, evidence=evidence,
                           clock=detected_clock, detected_clock=detected_clock)
        return Failure(kind=f"natural ({kind})", at=row.failed_at, detected=row.detected, evidence=evidence,
                       clock=evidence_clock(self.run.paths, evidence, row.attempt, _one(row.failed_nodes)),
                       detected_clock=detected_clock)


def _one(nodes: str | None) -> str | None:
    """The one node a failure was blamed on (a hang's silent rank's), if it was one."""
    return nodes if nodes and "," not in nodes else None


def ran(row: AttemptRow) -> bool:
    """The attempt reached the scheduler (so a failure of it is one a later attempt recovers from)."""
    return row.job_id is not None and row.state != SUBMIT_FAILED
