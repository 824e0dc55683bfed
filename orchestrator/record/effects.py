"""Did each fault do what it is for? Checked when the drill is reported, from the run's own
evidence, never from the injector's word alone: a SIGKILL that hit a wrapper or a launcher while
the training processes trained on, or a SIGSTOP that stopped only a shell, reads as "injected"
and the run as recovered, with nothing lost, unless the ranks' own records are asked.

A fault that halts its target (``FaultKind.halts_target``: SIGKILL, SIGSTOP, a node crash; a stall
for as long as its record says it stood still):
- **trained on**: a target rank's heartbeat of the fault's attempt after the fault (on one clock,
  each rank's node's offset applied; for a stall, before it was continued; for a SIGSTOP, before the
  first sign of the attempt's failure, a rank's error included: the teardown that follows, the
  scheduler's or the drill's, sends SIGCONT before SIGTERM), at a step past the one it had reached
  (for a SIGSTOP, past the one after it: a continued rank finishes the step it was stopped in):
  INEFFECTIVE.
- **resumed past the fault**: the next recovery resumed from a step its attempt could not have
  reached by the fault (the last heartbeat before it, plus what the attempt's pace allows in the
  time since that beat: heartbeats are rate-limited, and the beat before each checkpoint is always
  written): a checkpoint written after the fault, by a process it should have stopped: INEFFECTIVE.
  A warm recovery whose state came from a surviving peer (no rollback) is not asked.
And of every run:
- **stalled at its end**: an attempt that wrote its final record and whose ranks did not exit within
  ``restart.finish_timeout_s`` (the drill cancelled the job): something of the run outlived its
  training: SUSPICIOUS.

A drill with a finding exits 6 (``faultdrill drill``) unless the spec says ``allow_ineffective``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    Heartbeat,
    RankError,
    RunPaths,
    first_event,
    read_attempt_events,
    read_json_lines,
)
from injectors.kinds import get_kind
from injectors.kinds.base import Site
from orchestrator.record.clocks import AttemptClocks, Stamp, load_clocks
from orchestrator.record.ledger import AttemptRow, FaultRow, RecoveryRow
from orchestrator.record.stamps import evidence_clock, fault_clock, rank_node

INEFFECTIVE = "ineffective"
SUSPICIOUS = "suspicious"
INJECTED = "injected"  # orchestrator.faults.book's outcome (not imported: the book imports the record)
# A beat stamped on the same clock as the fault, at most this long after it, is one the rank wrote
# as the signal was being sent (the fault's moment is taken just before).
SAME_CLOCK_ALLOWANCE_S = 0.2
# Across a clock that was not read: what synchronized clocks are apart at most (orchestrator.faults.book).
UNREAD_CLOCK_ALLOWANCE_S = 0.5
# A fault that acts from the login node through a command (a node crash: the cluster's script, a
# site's own) is stamped as the command starts; the node goes this long after, at most.
COMMAND_ACT_ALLOWANCE_S = 2.0
JUMP_WINDOW_S = 5.0  # a stalled rank's beats this long after it was continued are held to its pace
STALLED_AT_END = "did not exit within restart.finish_timeout_s"
_TARGET_RANKS = re.compile(r"(?:^|; )ranks? ([\d,]+)@")
_STOOD_STILL = re.compile(r"stopped for (\d+(?:\.\d+)?) s")  # stall-rank's record of how long
_NODES_SPREAD = re.compile(r"nodes acted within (\d+(?:\.\d+)?) s")  # agents on several nodes (inject.py)
_COMMAND_TOOK = re.compile(r"the command took (\d+(?:\.\d+)?) s")  # a node fault's record (node_faults.py)


@dataclass(frozen=True)
class Finding:
    verdict: str  # INEFFECTIVE or SUSPICIOUS
    what: str  # in words, with the evidence
    fault: int | None = None  # the fault's position in the run's faults (as the report lists them)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "what": self.what, "fault": self.fault}


@dataclass(frozen=True)
class RunEvidence:
    """What one run's check reads: its files, its rank count, and its ledger rows."""

    paths: RunPaths
    ranks: int
    faults: list[FaultRow]
    recoveries: list[RecoveryRow]
    attempts: list[AttemptRow]
    # each file read once per check, however many faults and ranks ask for it
    _clocks: dict[int, AttemptClocks] = field(default_factory=dict, init=False, repr=False, compare=False)
    _nodes: dict[tuple[int, int], str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _beats: dict[tuple[int, int], list[tuple[float, int]]] = field(default_factory=dict, init=False, repr=False,
                                                                   compare=False)
    _failing: dict[int, float | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def clocks(self, attempt: int) -> AttemptClocks:
        if attempt not in self._clocks:
            self._clocks[attempt] = load_clocks(self.paths.clocks_file(attempt))
        return self._clocks[attempt]

    def node(self, attempt: int, rank: int) -> str:
        """The node rank ``rank`` of ``attempt`` ran on, whose clock stamped its records."""
        if (attempt, rank) not in self._nodes:
            self._nodes[attempt, rank] = rank_node(self.paths, attempt, rank)
        return self._nodes[attempt, rank]

    def failing_from(self, attempt: int) -> float | None:
        """The first sign that ``attempt`` was failing (login clock), from which it may have been torn
        down: a rank's recorded error, the moment its failure is dated to, the controller's
        detection; None while there is none. A teardown (the scheduler's end of a step, the drill's
        cancel) sends SIGCONT before SIGTERM: a stopped rank runs again for a moment."""
        if attempt not in self._failing:
            row = next((row for row in self.attempts if row.attempt == attempt), None)
            signs = self._rank_errors(attempt) + (self._row_signs(row) if row is not None else [])
            self._failing[attempt] = min(signs, default=None)
        return self._failing[attempt]

    def _row_signs(self, row: AttemptRow) -> list[float]:
        """The moment the attempt's failure is dated to, where nothing was torn down before it (not a
        hang's last beat, not a stuck start's start), and its detection, each on the login clock."""
        dated = None
        if row.failed_at is not None:
            nodes = row.failed_nodes if row.failed_nodes and "," not in row.failed_nodes else None
            clock = evidence_clock(self.paths, row.failure_evidence or "", row.attempt, nodes)
            dated = self.clocks(row.attempt).on_login(Stamp(row.failed_at, clock)).time
        signs = [dated] if dated is not None and row.failure_evidence not in ("last_heartbeat", "job_running", "node_check") else []
        if row.detected is not None:  # the controller's clock, or a warm coordinator's (the failure's own moment)
            signs.append(dated if row.detected == row.failed_at and dated is not None else row.detected)
        return signs

    def _rank_errors(self, attempt: int) -> list[float]:
        """When each rank of ``attempt`` that recorded its error did (login clock)."""
        moments = []
        for rank in range(self.ranks):
            try:
                error = RankError.from_json(json.loads(self.paths.rank_error_file(attempt, rank).read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            moments.append(self.clocks(attempt).on_login(Stamp(error.time, self.node(attempt, rank))).time)
        return moments

    def beats(self, attempt: int, rank: int) -> list[tuple[float, int]]:
        """Rank ``rank``'s beats of ``attempt`` as (login-clock time, step), oldest first."""
        if (attempt, rank) not in self._beats:
            self._beats[attempt, rank] = self._read_beats(attempt, rank)
        return self._beats[attempt, rank]

    def _read_beats(self, attempt: int, rank: int) -> list[tuple[float, int]]:
        clocks, node = self.clocks(attempt), self.node(attempt, rank)
        beats = []
        for record in read_json_lines(self.paths.heartbeat_file(attempt, rank)):
            try:
                beat = Heartbeat.from_json(record)
            except (KeyError, TypeError, ValueError):
                continue
            if beat.attempt == attempt and beat.phase is None:  # a phase's beat (resume, checkpoint) is no step
                beats.append((clocks.on_login(Stamp(beat.time, node)).time, beat.step))
        return sorted(beats)


def verify_run(run: RunEvidence) -> tuple[list[str], list[Finding]]:
    """Each fault's effect in words ("" where the evidence does not say), and the run's findings."""
    effects, findings = [], []
    for index, fault in enumerate(run.faults):
        found = _fault_findings(run, index, fault)
        findings += found
        effects.append(found[0].what if found else _verified(run, fault))
    findings += _stalled_at_end(run.attempts)
    return effects, findings


def _halts(fault: FaultRow) -> bool:
    if fault.outcome != INJECTED or fault.at is None:
        return False
    try:
        return get_kind(fault.kind).halts_target(fault.signal)
    except (KeyError, ValueError):  # a kind this version does not know
        return False


def _fault_findings(run: RunEvidence, index: int, fault: FaultRow) -> list[Finding]:
    if not _halts(fault):
        return []
    moment = _FaultMoment.of(run, fault)
    found = [Finding(INEFFECTIVE, what, index) for rank in _halted_ranks(run, fault)
             if (what := _trained_on(run, moment, rank)) is not None]
    if not get_kind(fault.kind).ends_attempt:  # a stall: the attempt goes on, no resume to ask
        return found
    past = _resumed_past(run, moment)
    return found + ([Finding(INEFFECTIVE, past, index)] if past is not None else [])


def _verified(run: RunEvidence, fault: FaultRow) -> str:
    if not _halts(fault):
        return ""
    ranks = _halted_ranks(run, fault)
    if not any(run.beats(fault.attempt, rank) for rank in ranks):
        return ""  # nothing of its targets' to read (a rank that never beat): not checked
    return "verified: its target made no progress after it"


@dataclass(frozen=True)
class _FaultMoment:
    """A fault's moment on the login clock, and how far a rank's stamp may lie past it unnoticed."""

    fault: FaultRow
    at: float  # the login clock's
    clock: str  # the clock that stamped it
    uncertainty_s: float | None  # None: its clock was not read
    clocks: AttemptClocks

    @classmethod
    def of(cls, run: RunEvidence, fault: FaultRow) -> "_FaultMoment":
        clocks = run.clocks(fault.attempt)
        assert fault.at is not None
        on_login = clocks.on_login(Stamp(fault.at, fault_clock(fault.kind, fault.node)))
        return cls(fault, on_login.time, on_login.clock, on_login.uncertainty_s, clocks)

    def allowance(self, node: str) -> float:
        """How long after the fault a stamp of ``node``'s may still be from before it: the act's own
        time, and the two clocks' uncertainty."""
        act = SAME_CLOCK_ALLOWANCE_S
        spread = _NODES_SPREAD.search(self.fault.detail or "")  # the fault's moment is the first node's
        act += float(spread.group(1)) if spread else 0.0
        if get_kind(self.fault.kind).site is Site.CONTROLLER:  # stamped before its command ran: the node went since
            took = _COMMAND_TOOK.search(self.fault.detail or "")
            act = COMMAND_ACT_ALLOWANCE_S + (float(took.group(1)) if took else 0.0)
        if self.clocks.one_clock or node == self.clock:
            return act
        other = self.clocks.on_login(Stamp(self.at, node)).uncertainty_s
        if self.uncertainty_s is None or other is None:
            return act + UNREAD_CLOCK_ALLOWANCE_S
        return act + self.uncertainty_s + other


def _halted_ranks(run: RunEvidence, fault: FaultRow) -> list[int]:
    """The ranks the fault should have halted: those its target names (every node's part of it:
    "rank 0@n1; rank 1@n2"); a launcher's, or a node's: every rank of the attempt on its node(s)."""
    named = _TARGET_RANKS.findall(fault.target)
    if named and "launcher" not in (fault.detail or ""):
        return sorted({int(rank) for part in named for rank in part.split(",") if rank})
    nodes = set((fault.node or "").split(","))
    return [rank for rank in range(run.ranks) if run.node(fault.attempt, rank) in nodes]


def _trained_on(run: RunEvidence, moment: _FaultMoment, rank: int) -> str | None:
    """Rank ``rank``'s first step past the fault's, beaten after the fault, in words; or None."""
    node = run.node(moment.fault.attempt, rank)
    beats = run.beats(moment.fault.attempt, rank)
    before = [step for time, step in beats if time <= moment.at]
    reached = max(before, default=-1)
    bar = reached
    if moment.fault.signal == "SIGSTOP":  # continued by a teardown, it finishes the step it was in (beats lag)
        bar = max(reached, moment.fault.met_step if moment.fault.met_step is not None else -1) + 1
    late = moment.at + moment.allowance(node)
    stood = _STOOD_STILL.search(moment.fault.detail or "")
    until = moment.at + float(stood.group(1)) - moment.allowance(node) if stood else float("inf")
    # What a stopped rank does once its attempt is failing (and torn down, continuing it) is no
    # evidence; a killed one cannot be continued (its trainer's steps once the rank died still are)
    failing = run.failing_from(moment.fault.attempt) if moment.fault.signal == "SIGSTOP" else None
    window_end = min(until, failing if failing is not None else float("inf"))
    after = [(time, step) for time, step in beats if late < time < window_end and step > bar]
    if not after and stood:
        return _jumped_after_the_stall(moment, rank, beats, reached, until, moment.allowance(node))
    if not after:
        return None
    time, step = after[0]
    last_time, last_step = after[-1]
    return (f"{INEFFECTIVE}: rank {rank} trained on after the {moment.fault.kind} ({moment.fault.signal or 'its act'}): "
            f"step {step} {time - moment.at:.2f} s after it, step {last_step} {last_time - moment.at:.2f} s after "
            f"(it had reached step {max(reached, 0)}): the fault hit another process than the one that trains")


def _jumped_after_the_stall(moment: _FaultMoment, rank: int, beats: list[tuple[float, int]], reached: int,
                            until: float, allowance: float) -> str | None:
    """A stalled rank whose first beats once continued are further on than its pace allows from
    where it stood: it trained while stopped, its steps told only later (a supervisor that reads a
    wrapper's log, stopped with the wrapper, writes them when it is continued)."""
    before = [(time, step) for time, step in beats if time <= moment.at]
    resumed = [(time, step) for time, step in beats if until <= time <= until + JUMP_WINDOW_S]
    if len(before) < 2 or not resumed:
        return None
    pace, burst = _pace(before)
    for time, step in resumed:
        allowed = reached + burst + math.ceil(pace * (time - until + 2 * allowance)) + 1
        if step > allowed:
            return (f"{INEFFECTIVE}: rank {rank} was at step {step} {time - until - allowance:.2f} s after it was "
                    f"continued, from step {max(reached, 0)} when the {moment.fault.kind} stopped it (its pace "
                    f"allows {allowed}): it trained while stopped")
    return None


def _resumed_past(run: RunEvidence, moment: _FaultMoment) -> str | None:
    """The recovery after the fault, if it resumed from a step the faulted attempt could not have
    reached by the fault (a checkpoint written after it), in words; or None."""
    after = [recovery for recovery in run.recoveries if recovery.attempt > moment.fault.attempt]
    if not after:
        return None
    recovery = min(after, key=lambda found: found.attempt)
    if recovery.state_source == "peer":  # warm: a survivor's state, no rollback
        return None
    bound = _step_bound(run, moment)
    own = [found.resumed_from_step for found in run.recoveries if found.attempt == moment.fault.attempt]
    bound = max([*([bound] if bound is not None else []), *own], default=None)  # at least where it resumed itself
    resumed = recovery.resumed_from_step - _inferred_slack(run, recovery.attempt, moment.fault.attempt)
    if bound is None or resumed <= bound:
        return None
    return (f"{INEFFECTIVE}: attempt {recovery.attempt} resumed from step {recovery.resumed_from_step}, which attempt "
            f"{moment.fault.attempt} could not have reached by the {moment.fault.kind} (at most step {bound}): its "
            "checkpoint was written after the fault, by a process the fault should have stopped")


def _inferred_slack(run: RunEvidence, resumed: int, faulted: int) -> int:
    """How far below the resume step it took the true one may be: a zero-code resume read from the
    first step a script logged (no checkpoint file named it) is that step less one, and a script that
    logs every N steps resumed up to N - 1 steps earlier (N: the widest gap between its logged steps)."""
    loaded = first_event(read_attempt_events(run.paths, resumed), EVENT_CHECKPOINT_LOADED)
    if loaded is None or not loaded.fields.get("inferred") or "first step" not in str(loaded.fields.get("source", "")):
        return 0
    gaps = [_pace(run.beats(attempt, rank))[1] for attempt in (faulted, resumed) for rank in range(run.ranks)]
    return max(0, max(gaps, default=1) - 1)


def _step_bound(run: RunEvidence, moment: _FaultMoment) -> int | None:
    """The highest step the fault's attempt can have reached by the fault: over its ranks, the last
    beat before the fault (and its allowance) plus the steps the rank's pace allows since that beat,
    plus the most one beat told at once (a burst of buffered output), plus one in progress; None
    where no rank beat before it."""
    bounds = []
    for rank in range(run.ranks):
        node = run.node(moment.fault.attempt, rank)
        until = moment.at + moment.allowance(node)
        beats = [(time, step) for time, step in run.beats(moment.fault.attempt, rank) if time <= until]
        if not beats:
            continue
        last_time, last_step = beats[-1]
        pace, burst = _pace(beats)
        bounds.append(last_step + burst + math.ceil(pace * max(0.0, until - last_time)) + 1)
    return max(bounds) if bounds else None


def _pace(beats: list[tuple[float, int]]) -> tuple[float, int]:
    """A rank's steps a second while it trains, over ``beats`` (time, step), and the most steps one
    beat told at once beyond the one before it: a script whose output comes in bursts (a pipe's
    buffer) is told that far behind at any moment."""
    if len(beats) < 2:
        return 0.0, 0
    pairs = list(zip(beats, beats[1:], strict=False))
    # the pace while training: the median of each beat's rate since the one before (an average over
    # the attempt counts its pauses, a checkpoint, an evaluation, and comes out too slow)
    rates = sorted((later[1] - earlier[1]) / (later[0] - earlier[0]) for earlier, later in pairs if later[0] > earlier[0])
    pace = rates[len(rates) // 2] if rates else 0.0
    burst = max(later[1] - earlier[1] for earlier, later in pairs)
    return max(0.0, pace), max(0, burst)


def _stalled_at_end(attempts: list[AttemptRow]) -> list[Finding]:
    return [Finding(SUSPICIOUS, f"{SUSPICIOUS}: attempt {row.attempt} wrote its final record, then its ranks did not "
                                "exit within restart.finish_timeout_s and the drill cancelled its job: something of "
                                "the run outlived its training (a process the launch does not end)")
            for row in attempts if STALLED_AT_END in f"{row.reason or ''} {row.ended_by_drill or ''}"]
