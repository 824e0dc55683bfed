"""The projection's model checked against the drill itself (issue 25): each faulted run replayed
with its own failures (when each came, after training resumed) and its own measured recoveries,
through the simulator's arithmetic (orchestrator/project/simulate.py ``replay``); the goodput that
predicts beside the goodput the drill measured (orchestrator/report/document.py ``goodput``).

What the model does not cover is taken as measured: the first attempt's way to its first step (the
queue and a cold start before any failure) and the last attempt's end after its last step. Every
moment is put on the login node's clock first (each node's offset as the drill read it: the same
move the recoveries' phases had). A run that cannot be replayed is named with the reason: it did not
complete, its own records contradict its faults, it is a user's own script (its checkpoint interval
is its own, its progress read from its logs), a node clock was not read, an attempt left no first
step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EventRecord,
    RunPaths,
    first_event,
    read_attempt_events,
)
from orchestrator.project.measured import ineffective_faults
from orchestrator.project.simulate import replay
from orchestrator.record.clocks import AttemptClocks, Stamp, load_clocks
from orchestrator.record.stamps import rank_node
from orchestrator.report.document import build_report


@dataclass(frozen=True)
class RunReplay:
    run_id: str
    strategy: str
    failures: int
    measured_goodput: float
    replayed_goodput: float
    measured_lost_s: float  # the work the drill re-did (its recoveries' lost_s)
    replayed_lost_s: float  # what the model says it re-did

    @property
    def error(self) -> float:
        return self.replayed_goodput / self.measured_goodput - 1


@dataclass(frozen=True)
class NotReplayed:
    run_id: str
    why: str


class CannotReplay(Exception):
    """Why a run cannot be replayed."""


def replay_drill(workdir: Path) -> tuple[list[RunReplay], list[NotReplayed]]:
    """Every run of the drill that failed, recovered and completed, replayed; the faulted runs that
    could not be, each with the reason (a run without faults or recoveries has nothing to replay)."""
    report = build_report(workdir)
    replays, skipped = [], []
    for run in report["runs"]:
        if not run["recoveries"] and not run["faults"]:
            continue
        try:
            replays.append(_replay_run(workdir, run))
        except CannotReplay as why:
            skipped.append(NotReplayed(run["run_id"], str(why)))
    return replays, skipped


def _replayable(run: dict[str, Any]) -> None:
    if run["status"] != "completed":
        raise CannotReplay(f"it did not complete ({run['status']})")
    if not run["recoveries"]:
        raise CannotReplay("it recovered from nothing")
    if ineffective_faults(run) != set():
        raise CannotReplay("its ranks' own records say a fault was ineffective (the report's findings)")
    if run["progress"]["inferred"]:
        raise CannotReplay("a user's own script: its checkpoint interval is its own, its progress read from its logs")
    if not run["step_time_s"] or not run["checkpoint_every_steps"]:
        raise CannotReplay("no step time or checkpoint interval was measured")
    if any(recovery["clocks_not_read"] for recovery in run["recoveries"]):
        raise CannotReplay("a node clock its recoveries span was not read: its moments are on no one clock")


def _replay_run(workdir: Path, run: dict[str, Any]) -> RunReplay:
    _replayable(run)
    recoveries, attempts = run["recoveries"], run["attempts"]
    paths = RunPaths(workdir / "runs" / run["run_id"])
    on_login = _LoginClock(paths, len(attempts))
    last = len(attempts) - 1
    started = on_login.rank0(0, EVENT_FIRST_STEP)
    completed = on_login.rank0(last, EVENT_COMPLETED)
    submitted = [a["submitted"] for a in attempts if a["submitted"] is not None]
    ended = [a["ended"] for a in attempts if a["ended"] is not None]
    if not submitted or not ended:
        raise CannotReplay("an attempt's submission or end was not recorded")
    useful = run["final_step"] * run["step_time_s"]
    elapsed = max(ended) - min(submitted)
    # each failure on the login clock: its recovery's first step less its time to recover
    resumed_at = [on_login.rank0(int(r["attempt"]), EVENT_FIRST_STEP) for r in recoveries]
    failed_at = [at - r["ttr_s"] for at, r in zip(resumed_at, recoveries, strict=True)]
    gaps = [fail - resumed for fail, resumed in zip(failed_at, [started, *resumed_at], strict=False)]
    if min(gaps) < 0:
        raise CannotReplay("a failure before training resumed, on the login clock")
    step_wall_s = _step_wall_s(on_login, recoveries, failed_at, run["final_step"], completed)
    # a step's wall time as the run trained (checkpoints included, as the drill's lost_s counts
    # them): the model's training is the drill's, every failure and recovery as it was
    model = replay(run["final_step"] * step_wall_s, run["checkpoint_every_steps"] * step_wall_s, 0.0,
                   gaps, [(r["ttr_s"], _kept_the_work(r), r["lost_s"]) for r in recoveries])
    head, tail = started - min(submitted), max(ended) - completed
    return RunReplay(run["run_id"], run["strategy"], len(recoveries), useful / elapsed,
                     useful / (head + model.wall_s + tail), sum(r["lost_s"] for r in recoveries), model.rework_s)


class _LoginClock:
    """Rank 0's moments on the login clock: each attempt's readings, merged with the run's other
    attempts' (a node read while one attempt ran is the same clock in the next, as the recoveries
    were computed). A run of which no attempt has a reading is on one clock (the local backend, an
    older drill); one whose rank 0 ran on a node no attempt read cannot be replayed."""

    def __init__(self, paths: RunPaths, attempts: int) -> None:
        self.paths = paths
        self.read = {attempt: load_clocks(paths.clocks_file(attempt)) for attempt in range(attempts)}
        self.measured = any(clocks.one_clock or clocks.readings for clocks in self.read.values())

    def rank0(self, attempt: int, event: str) -> float:
        """When rank 0 of ``attempt`` wrote its first ``event``, on the login clock."""
        return self.first(attempt, event)[0]

    def first(self, attempt: int, event: str) -> tuple[float, EventRecord]:
        """Rank 0's first ``event`` of ``attempt``, and when it came on the login clock."""
        found = first_event(read_attempt_events(self.paths, attempt), event)
        if found is None:
            raise CannotReplay(f"attempt {attempt} left no {event} event")
        clocks = self.read.get(attempt) or AttemptClocks()
        for other in self.read.values():
            clocks = clocks.merged_with(other)
        moved = clocks.on_login(Stamp(found.time, rank_node(self.paths, attempt, 0)))
        if moved.uncertainty_s is None and self.measured:
            raise CannotReplay(f"the clock of attempt {attempt}'s rank 0 ({moved.clock}) was not read")
        return moved.time, found


def _step_wall_s(on_login: _LoginClock, recoveries: list[dict[str, Any]], failed_at: list[float], final_step: int,
                 completed_at: float) -> float:
    """A step's wall time as the run trained, over all its attempts: each from its first step to
    its failure (its last step: where the next resumed, plus the steps it lost) or its completion."""
    spans: list[tuple[float, int]] = []
    ends = [(at, r["resumed_from_step"] + r["lost_steps"]) for at, r in zip(failed_at, recoveries, strict=True)]
    # the attempts that trained: the first, then each recovery's (restarts that failed before their
    # first step are skipped by the recoveries' attempt numbers)
    trained = [0] + [int(r["attempt"]) for r in recoveries]
    for attempt, (end_at, end_step) in zip(trained, [*ends, (completed_at, final_step)], strict=True):
        started_at, first = on_login.first(attempt, EVENT_FIRST_STEP)  # the events read once
        spans.append((end_at - started_at, end_step - int(first.number("step", float(end_step)))))
    steps = sum(count for _, count in spans)
    if steps < 10:
        raise CannotReplay(f"it trained {steps} steps: too few for a step time")
    return sum(seconds for seconds, _ in spans) / steps


def _kept_the_work(recovery: dict[str, Any]) -> bool:
    """The run resumed where it failed: from a survivor's state (warm), or from the checkpoint its
    ranks wrote on the scheduler's warning (a preemption, a walltime): nothing to roll back."""
    return recovery.get("state_source") == "peer" or (recovery["lost_steps"] == 0 and
                                                      recovery.get("failure_class") in ("PREEMPTED", "TIMEOUT"))
