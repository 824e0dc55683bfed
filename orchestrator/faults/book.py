"""One run's planned faults: when each may fire, and how each one ended.

Rules (so that every fault is measured against one failure, and every planned fault is accounted
for):
- a fault fires only into a healthy attempt (running, not completed, not failing), at its anchor
  in that attempt plus its delay;
- the next fault waits until the effect of the previous one is known: one fault in flight at a
  time, and after a fault that ends its attempt (a kill, a hang) reached it, the next one fires only
  in a later attempt; after one the attempt is meant to survive (a stall, a damaged checkpoint), once
  the agent is done and the attempt still healthy;
- every fault row ends as INJECTED (with what it caused), REFUSED (its target could not be verified;
  why), ABSORBED (it hit an attempt that was already failing), LATE (it came after its attempt had
  trained to the run's last step: that attempt completed all the same, or the failure it caused cost
  no step, the next attempt finding the run complete, as the run's end shows) or NOT_FIRED (why);
- a fault that acted records the step its attempt had reached then (``met_step``), beside the step
  an ``at_step`` fault was planned for;
- an ``at_step`` fault that acts on ranks is sent ahead of its step (ARM_LEAD_S) and acts on the
  node when the step comes; an agent that waited its time short of it is sent again, on the same
  row (journaled: SHORT_OF_STEP), at once while the attempt's speed is unknown, else once the step is
  near.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from experiments.layout import RunPaths
from injectors.kinds import get_kind
from injectors.kinds.base import FaultOutcome, Site, Target
from injectors.schedule import PlannedFault
from injectors.targets import StepNotReached, TargetRefused
from orchestrator.campaign.failure_classes import LETHAL_SIGNALS
from orchestrator.commands import one_line
from orchestrator.observe.watch import AttemptWatch, FailureSign
from orchestrator.record.clocks import LOGIN, SCHEDULER, AttemptClocks, OnLogin, Stamp, load_clocks
from orchestrator.record.ledger import FaultRow, Ledger
from orchestrator.record.stamps import evidence_clock, fault_clock, rank_node
from orchestrator.states import JobState

log = logging.getLogger(__name__)

SENDING = "sending"  # the agent is acting; a controller stopped meanwhile leaves this behind
INJECTED = "injected"
REFUSED = "refused"
ABSORBED = "absorbed"
LATE = "late"
NOT_FIRED = "not fired"
UNKNOWN = "unknown"  # sent by a controller that stopped before the agent answered
WENT_ON = "went on: "  # the detail of a fault its attempt survived (it caused no failure)
ACTED = "acted: "  # what the agent said of a fault whose effect is not known yet
SHORT_OF_STEP = "its agent came back short of its step: sent again nearer to it"  # an at_step fault's
# Evidence that dates the failure itself (not just the last sign of life), with its resolution in
# seconds (the scheduler's end time is whole seconds): a fault that acted after it hit an attempt
# that was already failing.
FAILURE_MOMENT_EVIDENCE = {"step_exit": 0.0, "warm": 0.0, "scheduler_end": 1.0}
# A fault dated against its attempt's failure across a node clock that was not read: absorbed only
# when it came this much later (as the clocks read), past what synchronized clocks are apart.
UNREAD_CLOCK_ALLOWANCE_S = 0.5
COLLECT_TIMEOUT_S = 120.0
# A due fault that uses the nodes' clocks waits for its attempt's to be read at most this long.
CLOCK_WAIT_S = 10.0
# An at_step fault acting on ranks: its agent is started this long before the step is due (at the
# attempt's speed), or as soon as the ranks have registered while the speed is not known yet; it
# waits on the node for the step (injectors/kinds/moment.py).
ARM_LEAD_S = 3.0


@dataclass
class InFlight:
    fault_id: int
    attempt: int
    future: Future[FaultOutcome]
    fault: PlannedFault
    # Set by the injector thread as soon as a node fault broke its node (one assignment: safe to
    # read from the controller's thread); written to the ledger at the next round.
    acted: tuple[float, str] | None = None
    acted_recorded: bool = False


@dataclass(frozen=True)
class AttemptEnd:
    sign: FailureSign | None  # None: the attempt completed
    completed: bool


CAUSED = "caused: "  # the detail of a fault whose attempt failed of it
OnActed = Callable[[float, str], None]
Act = Callable[[int, str, PlannedFault, OnActed], FaultOutcome]  # (attempt, job id, fault, on_acted): carry it out
OnRecord = Callable[[int], None]  # (attempt): an agent's record that may change the attempt's class came in
StepAt = Callable[[int, float], int]  # (attempt, moment): the step the attempt had reached then


@dataclass(frozen=True)
class RunProgress:
    """What the book asks of the run's progress: the step an attempt had reached at a moment, and
    the run's last step (a fault met at it came too late)."""

    step_at: StepAt
    last_step: int


class FaultBook:
    def __init__(self, run_id: str, plan: list[PlannedFault], ledger: Ledger, pool: ThreadPoolExecutor, act: Act,
                 on_record: OnRecord | None = None, progress: RunProgress | None = None, paths: RunPaths | None = None,
                 clocks_pending: Callable[[int], bool] = lambda attempt: False):
        self.run_id, self.plan, self.ledger, self.pool, self.act = run_id, plan, ledger, pool, act
        self.paths = paths  # the run's files: its attempts' node clocks (a fault's moment against a failure's)
        self.clocks_pending = clocks_pending  # an attempt's node clocks are being read: not kept as read yet
        self._clocks_read: dict[int, AttemptClocks] = {}
        self._rank0_offsets: dict[int, float] = {}
        self.on_record = on_record
        self.progress = progress
        self.in_flight: InFlight | None = None
        self._clock_wait_since: float | None = None  # a due fault has waited for its attempt's clocks since
        self.ended: dict[int, AttemptEnd] = {}  # attempts that ended, until their faults are settled
        rows = ledger.faults(run_id)
        # The row of an at_step fault whose agent came back short of its step (journaled: it is sent
        # again, by this controller or the next).
        self.rearm: int | None = None
        for row in rows:
            if row.outcome == SENDING and row.fault_id is not None and row.detail == SHORT_OF_STEP:
                self.rearm = row.fault_id
            elif row.outcome == SENDING and row.fault_id is not None:
                ledger.update_fault(row.fault_id, outcome=UNKNOWN,
                                    detail="the controller stopped while the fault agent was acting")
        self.next_index = max((row.plan_index for row in rows), default=-1) + (0 if self.rearm is not None else 1)
        # After a fault that ends its attempt reached attempt A, the next one waits for a later attempt.
        reached = [row.attempt for row in rows if row.outcome in (SENDING, INJECTED, ABSORBED, LATE, UNKNOWN)
                   and get_kind(row.kind).ends_attempt and row.fault_id != self.rearm]
        self.blocked_through: int | None = max(reached, default=None)

    @property
    def sent(self) -> int:
        return self.next_index

    # firing -----------------------------------------------------------------------------------
    def maybe_fire(self, watch: AttemptWatch, now: float) -> None:
        if self.in_flight is not None or self.next_index >= len(self.plan):
            return
        if self.blocked_through is not None and watch.attempt <= self.blocked_through:
            return
        if watch.state is not JobState.RUNNING or watch.completed or watch.failing:
            return
        fault = self.plan[self.next_index]
        if not _due(fault, watch, now, self._rank0_offset(watch.attempt)):
            return
        if self._waits_for_clocks(fault, watch.attempt, now):
            return
        if self.rearm is not None:  # its row stays: sent again, into the attempt now running
            fault_id, self.rearm = self.rearm, None
            self.ledger.update_fault(fault_id, attempt=watch.attempt, detail=None)
        else:
            fault_id = self.ledger.add_fault(_row(self.run_id, watch.attempt, fault, SENDING))
        self.next_index += 1
        pending: Future[FaultOutcome] = Future()
        flight = InFlight(fault_id, watch.attempt, pending, fault)

        def on_acted(at: float, node: str) -> None:
            flight.acted = (at, node)

        flight.future = self.pool.submit(self.act, watch.attempt, watch.job_id, fault, on_acted)
        self.in_flight = flight

    def _waits_for_clocks(self, fault: PlannedFault, attempt: int, now: float) -> bool:
        """A due fault that uses the nodes' clocks waits while its attempt's are being read, at most
        CLOCK_WAIT_S (then it goes with what is known, as it did before they were read)."""
        if not self.clocks_pending(attempt) or not uses_node_clocks(fault):
            self._clock_wait_since = None
            return False
        if self._clock_wait_since is None:
            self._clock_wait_since = now
        if now - self._clock_wait_since < CLOCK_WAIT_S:
            return True
        log.info("%s: fault %d waited %.0f s for attempt %d's node clocks: it goes without them", self.run_id,
                 fault.index, CLOCK_WAIT_S, attempt)
        self._clock_wait_since = None
        return False

    def collect(self, watch: AttemptWatch | None = None, wait: bool = False) -> None:
        """Record the agent's answer once it is in (``wait``: block for it, at the end of a run).
        ``watch``: the attempt now watched, to tell whether one the fault was not to end went on."""
        flight = self.in_flight
        if flight is not None and flight.acted is not None and not flight.acted_recorded:
            flight.acted_recorded = True  # in the ledger before the fault ends: a controller that dies knows it
            self.ledger.update_fault(flight.fault_id, at=flight.acted[0], node=flight.acted[1])
        if flight is None or not (wait or flight.future.done()):
            return
        self.in_flight = None
        try:
            outcome = flight.future.result(timeout=COLLECT_TIMEOUT_S if wait else 0)
        except StepNotReached:
            self.ledger.update_fault(flight.fault_id, detail=SHORT_OF_STEP)
            self.rearm, self.next_index = flight.fault_id, self.next_index - 1
        except TargetRefused as error:
            self._refused(flight, error)
        except Exception as error:  # the agent could not be started or gave no answer
            self.ledger.update_fault(flight.fault_id, outcome=REFUSED, detail=one_line(error))
            log.warning("%s: fault not injected: %s", self.run_id, error)
        else:
            self._injected(flight, outcome, watch)
        self._settle_ready()

    def _injected(self, flight: InFlight, outcome: FaultOutcome, watch: AttemptWatch | None) -> None:
        # An at_step fault's agent says the step it met (read on the node, no clock between).
        met = {"met_step": outcome.met_step} if outcome.met_step is not None else {}
        self.ledger.update_fault(flight.fault_id, at=outcome.at, pid=outcome.pid, node=outcome.node,
                                 target=outcome.target, signal=outcome.signal, outcome=INJECTED, **met)
        if get_kind(flight.fault.kind).ends_attempt:
            self.blocked_through = flight.attempt
            if outcome.detail:
                self.ledger.update_fault(flight.fault_id, detail=ACTED + outcome.detail)
            return
        healthy = watch is not None and watch.attempt == flight.attempt and not watch.failing
        if healthy:  # done, and the attempt is still going: it caused no failure (yet, at least)
            self.ledger.update_fault(flight.fault_id, detail=WENT_ON + (outcome.detail or "acted"))

    def _refused(self, flight: InFlight, error: TargetRefused) -> None:
        if error.gone:  # the target died first: the attempt was ending; settled once it has ended
            self.ledger.update_fault(flight.fault_id, outcome=ABSORBED, detail=one_line(error))
            self.blocked_through = flight.attempt
        else:
            self.ledger.update_fault(flight.fault_id, outcome=REFUSED, detail=one_line(error))
            log.warning("%s: fault refused: %s", self.run_id, error)

    # settling ---------------------------------------------------------------------------------
    def attempt_ended(self, attempt: int, sign: FailureSign | None, completed: bool) -> None:
        self.ended[attempt] = AttemptEnd(sign, completed)
        self._settle_ready()

    def settled(self, attempt: int) -> bool:
        """Every fault sent into ``attempt`` has its final outcome (the recovery may be credited)."""
        in_flight = self.in_flight is not None and self.in_flight.attempt == attempt
        return not in_flight and attempt not in self.ended

    def _settle_ready(self) -> None:
        """Settle the faults of each ended attempt whose fault has answered (at once: an attempt's
        end is known only to this controller)."""
        for attempt in sorted(self.ended):
            if self.in_flight is not None and self.in_flight.attempt == attempt:
                continue
            end = self.ended.pop(attempt)
            for row in self.ledger.faults(self.run_id):
                if row.attempt == attempt and row.fault_id is not None:
                    self._settle(row, attempt, end)

    def _settle(self, row: FaultRow, attempt: int, end: AttemptEnd) -> None:
        assert row.fault_id is not None
        self._met_step(row, attempt)
        if row.outcome == INJECTED and (row.detail is None or row.detail.startswith(ACTED)):
            acted = f"; {row.detail.removeprefix(ACTED)}" if row.detail else ""
            sign = end.sign
            if (end.completed or sign is None) and get_kind(row.kind).ends_attempt:
                # It acted, and its attempt trained to the end all the same: it came too late (the
                # ranks were finishing) or took no effect. No failure to recover from.
                self.ledger.update_fault(row.fault_id, outcome=LATE, detail=(
                    f"came too late: attempt {attempt} completed without failing{acted}"))
            elif end.completed or sign is None:
                self.ledger.update_fault(row.fault_id, detail=f"no failure: attempt {attempt} completed{acted}")
            elif (sign.evidence in FAILURE_MOMENT_EVIDENCE and row.at is not None
                  and (gap := self._failing_before(row, sign, attempt)) is not None):
                self.ledger.update_fault(row.fault_id, outcome=ABSORBED, detail=(
                    f"attempt {attempt} was already failing ({sign.reason}, {gap:.3f} s before){acted}"))
            else:
                self.ledger.update_fault(row.fault_id, detail=f"{CAUSED}attempt {attempt} failed: {sign.reason}{acted}")
                if (get_kind(row.kind).oom_kill_record or row.signal in LETHAL_SIGNALS) and self.on_record is not None:
                    # It caused the failure, which was classified before its record came (the agent
                    # answers once it has read the rank's end; a survivor's exit may be seen first):
                    # the class is taken again with it.
                    self.on_record(attempt)
        elif row.outcome == ABSORBED and end.completed:
            self.ledger.update_fault(row.fault_id, outcome=NOT_FIRED,
                                     detail=f"its target had exited: attempt {attempt} completed first")

    def _clocks(self, attempt: int) -> AttemptClocks:
        """``attempt``'s node clocks as the controller read them, a node not read there as the
        attempts beside it read it (kept once this controller's read of it is over)."""
        if self.paths is None:
            return AttemptClocks(one_clock=True)
        known = self._clocks_read.get(attempt)
        if known is None:
            paths = self.paths
            known = load_clocks(paths.clocks_file(attempt))
            for beside in (attempt - 1, attempt + 1):
                known = known.merged_with(load_clocks(paths.clocks_file(beside)))
            if not self.clocks_pending(attempt) and (known.one_clock or known.readings or known.unmeasured):
                self._clocks_read[attempt] = known
        return known

    def _rank0_offset(self, attempt: int) -> float:
        """How far rank 0's node's clock reads ahead of the login node's in ``attempt`` (0 unread)."""
        if self.paths is None:
            return 0.0
        if attempt not in self._rank0_offsets:
            clocks = self._clocks(attempt)
            if not clocks.readings:
                return 0.0  # one clock, or not read (yet)
            reading = clocks.readings.get(rank_node(self.paths, attempt, 0))
            self._rank0_offsets[attempt] = reading.offset_s if reading is not None else 0.0
        return self._rank0_offsets[attempt]

    def _failing_before(self, row: FaultRow, sign: FailureSign, attempt: int) -> float | None:
        """How long before the fault acted its attempt was dated failing, if surely before: both
        moments on the login clock (each node's stamp moved by the offset read from it), beyond the
        evidence's resolution and the clocks' bounds."""
        assert row.at is not None
        fault = Stamp(row.at, fault_clock(row.kind, row.node))
        silent = sign.node or (rank_node(self.paths, attempt, sign.rank) if self.paths and sign.rank is not None else None)
        failure = Stamp(sign.at, evidence_clock(self.paths, sign.evidence, attempt, silent) if self.paths else LOGIN)
        clocks = self._clocks(attempt)
        fault_at, failed_at = clocks.on_login(fault), clocks.on_login(failure)
        gap = fault_at.time - failed_at.time
        unread = fault.clock != failure.clock and None in (_bound(fault_at), _bound(failed_at))
        # Across a node clock that was not read, the moments as their clocks read them, and a skew
        # as large as this allowance
        bounds = UNREAD_CLOCK_ALLOWANCE_S if unread else (_bound(fault_at) or 0.0) + (_bound(failed_at) or 0.0)
        return gap if gap > FAILURE_MOMENT_EVIDENCE[sign.evidence] + bounds else None

    def _met_step(self, row: FaultRow, attempt: int) -> int | None:
        """The step ``attempt`` had reached when the fault acted, recorded with it (once): the
        fault's moment and the ranks' beats on the login clock."""
        if row.met_step is not None or row.at is None or self.progress is None or row.fault_id is None:
            return row.met_step
        met = self.progress.step_at(attempt, self._on_login(row))
        self.ledger.update_fault(row.fault_id, met_step=met)
        return met

    def caused_oom_attempts(self) -> list[int]:
        """The attempts an oom-rank's record says it caused to fail: a controller that starts again
        takes their classes again (the one before may have died between the record and that)."""
        return sorted({row.attempt for row in self.ledger.faults(self.run_id)
                       if row.outcome == INJECTED and get_kind(row.kind).oom_kill_record
                       and (row.detail or "").startswith(CAUSED)})

    def lost_nodes(self, attempt: int) -> tuple[str, ...]:
        """The nodes a node fault (node-crash, network-partition) broke in ``attempt``, as soon as
        it acted (the fault itself may still be holding the node down)."""
        flight = self.in_flight
        if flight is not None and flight.attempt == attempt and flight.acted is not None:
            return (flight.acted[1],)
        return tuple(row.node for row in self.ledger.faults(self.run_id)
                     if row.attempt == attempt and row.node and row.outcome in (INJECTED, UNKNOWN, SENDING)
                     and get_kind(row.kind).target is Target.NODE)

    def stopped_nodes(self, attempt: int) -> tuple[str, ...]:
        """The nodes of the ranks a fault stopped for good in ``attempt`` (hang-rank), by its record."""
        return tuple(row.node for row in self.ledger.faults(self.run_id)
                     if row.attempt == attempt and row.node and row.outcome == INJECTED
                     and get_kind(row.kind).stops_target)

    def oom_killed(self, attempt: int) -> tuple[str, ...]:
        """The targets the kernel's OOM killer ended in ``attempt``, by the agent's record (oom-rank)."""
        return tuple(row.target for row in self.ledger.faults(self.run_id)
                     if row.attempt == attempt and row.outcome == INJECTED and row.target
                     and get_kind(row.kind).oom_kill_record)

    def signalled(self, attempt: int, last_step: int) -> str | None:
        """The signal the agent's record says it sent a rank of ``attempt`` last (kill-rank), if any;
        while its answer is still on its way, the signal it was sent to send (the agent on the node
        answers after it killed, often after the rank's death has been seen), unless it waits for a
        step ``attempt`` has not reached (``last_step``): it has sent nothing yet."""
        flight = self.in_flight
        if (flight is not None and flight.attempt == attempt and flight.fault.kind == "kill-rank"
                and (flight.fault.at_step is None or last_step >= flight.fault.at_step)):
            return flight.fault.signal or "SIGKILL"
        sent = [row for row in self.ledger.faults(self.run_id)
                if row.attempt == attempt and row.outcome == INJECTED and row.signal and row.kind == "kill-rank"]
        return sent[-1].signal if sent else None

    def credited(self, attempt: int) -> FaultRow | None:
        """The fault that caused ``attempt`` to fail, if one did (a late one too: it failed the
        attempt, after its last step)."""
        hits = [row for row in self.ledger.faults(self.run_id) if row.attempt == attempt and row.outcome in (INJECTED, LATE)
                and row.at is not None and not (row.detail or "").startswith(WENT_ON)]
        return max(hits, key=lambda row: self._on_login(row)) if hits else None

    def _on_login(self, row: FaultRow) -> float:
        """The fault's moment on the login clock (as recorded where its clock was not read)."""
        assert row.at is not None
        return self._clocks(row.attempt).on_login(Stamp(row.at, fault_clock(row.kind, row.node))).time

    # the end of the run -----------------------------------------------------------------------
    def finish(self, status: str, last_attempt: int) -> None:
        """Collect the fault in flight, settle, and record every planned fault that never fired."""
        self.collect(wait=True)
        self._settle_ready()
        if self.rearm is not None:  # its agent came back short of its step, and no attempt reached it since
            self.ledger.update_fault(self.rearm, outcome=NOT_FIRED,
                                     detail=f"{_not_fired_because(status)}; its agent had waited for its step in vain")
            self.rearm, self.next_index = None, self.next_index + 1
        for fault in self.plan[self.next_index:]:
            self.ledger.add_fault(_row(self.run_id, last_attempt, fault, NOT_FIRED, _not_fired_because(status)))
        self.next_index = len(self.plan)
        if status == "completed":
            self._late_after_the_last_step(last_attempt)

    def _late_after_the_last_step(self, last_attempt: int) -> None:
        """A fault that failed its attempt after the attempt had reached the run's last step, and the
        next attempt ran no step (it found the run complete: every framework's resume does): it cost
        nothing, it came too late. (One whose next attempt trained again lost steps: a kill between
        the last step's heartbeat and its checkpoint.)"""
        if self.progress is None:
            return
        for row in self.ledger.faults(self.run_id):
            if (row.fault_id is None or row.outcome != INJECTED or not (row.detail or "").startswith(CAUSED)
                    or row.met_step is None or row.met_step < self.progress.last_step or row.attempt >= last_attempt):
                continue
            if self.progress.step_at(row.attempt + 1, float("inf")) == 0:
                self.ledger.update_fault(row.fault_id, outcome=LATE, detail=(
                    f"came too late: attempt {row.attempt} had reached the run's last step ({row.met_step}) before "
                    f"it, and attempt {row.attempt + 1} found the run complete; "
                    f"{(row.detail or '').removeprefix(CAUSED)}"))


def _row(run_id: str, attempt: int, fault: PlannedFault, outcome: str, detail: str | None = None) -> FaultRow:
    return FaultRow(fault_id=None, run_id=run_id, attempt=attempt, plan_index=fault.index, kind=fault.kind,
                    target=fault.target, signal=fault.signal, planned_delay_s=fault.delay_s, at=None, pid=None,
                    planned_step=fault.at_step,
                    node=None, outcome=outcome, detail=detail)


def _bound(moment: OnLogin) -> float | None:
    """A moment's uncertainty on the login clock; the scheduler's own clock counts as the login
    node's (its end time's whole seconds are its resolution: FAILURE_MOMENT_EVIDENCE)."""
    return 0.0 if moment.clock == SCHEDULER else moment.uncertainty_s


def uses_node_clocks(fault: PlannedFault) -> bool:
    """Whether acting out ``fault`` reads the nodes' clock offsets: one anchored in time (its anchor
    is stamped on rank 0's clock, and agents on several nodes are told one instant on each one's
    clock), or one the controller acts out (preempt, timeout: the ranks' warned checkpoint is found
    on rank 0's clock). An at_step fault on the ranks acts on its node at the step: no clock read."""
    return fault.at_step is None or get_kind(fault.kind).site is Site.CONTROLLER


def _due(fault: PlannedFault, watch: AttemptWatch, now: float, rank0_offset: float = 0.0) -> bool:
    """At its step in this attempt, or at its anchor in this attempt plus its delay. ``now`` is the
    login clock's; rank 0 stamps the first checkpoint and the first step on its node's clock, which
    reads ``rank0_offset`` ahead (the identity files' times are the filesystem's)."""
    if fault.at_step is not None:
        return watch.last_step >= fault.at_step or _arm_ahead(fault.at_step, fault, watch)
    rank0 = {"first_checkpoint": watch.first_checkpoint, "training_started": watch.training_started}
    anchor = watch.ranks_started if fault.anchor == "ranks_started" else rank0.get(fault.anchor, watch.training_started)
    if anchor is None:
        return False
    return now >= anchor - (0.0 if fault.anchor == "ranks_started" else rank0_offset) + fault.delay_s


def _arm_ahead(at_step: int, fault: PlannedFault, watch: AttemptWatch) -> bool:
    """Send an at_step rank fault's agent now, ahead of its step: once every rank has registered
    (the agent verifies them), while the attempt's speed is unknown or the step is ARM_LEAD_S away."""
    if get_kind(fault.kind).site is not Site.NODE or watch.ranks_started is None:
        return False
    speed = watch.steps_per_s()
    return speed is None or (at_step - watch.last_step) / speed <= ARM_LEAD_S


def _not_fired_because(status: str) -> str:
    return {
        "completed": "the run completed before the fault was due (or before an attempt it could hit)",
        "gave_up": "the run gave up (its restart budget was spent) first",
        "failed": "the run failed first",
        "cancelled": "the drill was cancelled first (faultdrill cancel)",
    }.get(status, f"the run ended ({status}) first")


