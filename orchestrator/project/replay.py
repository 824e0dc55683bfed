"""The projection's model checked against the drill itself (issue 25): each faulted run replayed
with its own failures (when each came, after training resumed) and its own measured recoveries,
through the simulator's arithmetic (orchestrator/project/simulate.py ``replay``); the goodput that
predicts beside the goodput the drill measured (orchestrator/report/document.py ``goodput``).

What the model does not cover is taken as measured: the first attempt's way to its first step (the
queue and a cold start before any failure) and the last attempt's end after its last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.layout import EVENT_COMPLETED, EVENT_FIRST_STEP, RunPaths, first_event, read_attempt_events
from orchestrator.project.simulate import replay
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


def replay_drill(workdir: Path) -> list[RunReplay]:
    """Every run of the drill that failed, recovered and completed, replayed (the others have no
    goodput to compare)."""
    report = build_report(workdir)
    replays = []
    for run in report["runs"]:
        replayed = _replay_run(workdir, run)
        if replayed is not None:
            replays.append(replayed)
    return replays


def _replay_run(workdir: Path, run: dict[str, Any]) -> RunReplay | None:
    recoveries = run["recoveries"]
    attempts = run["attempts"]
    if run["status"] != "completed" or not recoveries or not run["step_time_s"] or not run["checkpoint_every_steps"]:
        return None
    paths = RunPaths(workdir / "runs" / run["run_id"])
    started = first_event(read_attempt_events(paths, 0), EVENT_FIRST_STEP)
    last = len(attempts) - 1
    completed = first_event(read_attempt_events(paths, last), EVENT_COMPLETED)
    submitted = [a["submitted"] for a in attempts if a["submitted"] is not None]
    ended = [a["ended"] for a in attempts if a["ended"] is not None]
    if started is None or completed is None or not submitted or not ended:
        return None
    useful = run["final_step"] * run["step_time_s"]
    elapsed = max(ended) - min(submitted)
    step_wall_s = _step_wall_s(paths, recoveries, run["final_step"], completed.time)
    if step_wall_s is None:
        return None  # an attempt that trained left no first step: its rate is not known
    gaps, resumed = [], started.time
    for recovery in recoveries:
        gaps.append(recovery["fault_at"] - resumed)
        resumed = recovery["fault_at"] + recovery["ttr_s"]
    if min(gaps) < 0:
        return None  # a failure before training resumed: moments on clocks too far apart to replay
    # a step's wall time as the last attempt trained (checkpoints included, as the drill's lost_s
    # counts them): the model's training is the drill's, every failure and recovery as it was
    model = replay(run["final_step"] * step_wall_s, run["checkpoint_every_steps"] * step_wall_s, 0.0,
                   gaps, [(r["ttr_s"], _kept_the_work(r), r["lost_s"]) for r in recoveries])
    head, tail = started.time - min(submitted), max(ended) - completed.time
    return RunReplay(run["run_id"], run["strategy"], len(recoveries), useful / elapsed,
                     useful / (head + model.wall_s + tail), sum(r["lost_s"] for r in recoveries), model.rework_s)


def _step_wall_s(paths: RunPaths, recoveries: list[dict[str, Any]], final_step: int, completed_at: float) -> float | None:
    """A step's wall time as the run trained, over all its attempts: each from its first step to
    its failure (its last step: where the next resumed, plus the steps it lost) or its completion."""
    spans: list[tuple[float, int]] = []
    ends = [(r["fault_at"], r["resumed_from_step"] + r["lost_steps"]) for r in recoveries] + [(completed_at, final_step)]
    # the attempts that trained: the first, then each recovery's (restarts that failed before their
    # first step are skipped by the recoveries' attempt numbers)
    trained = [0] + [int(r["attempt"]) for r in recoveries]
    for attempt, (end_at, end_step) in zip(trained, ends, strict=True):
        first = first_event(read_attempt_events(paths, attempt), EVENT_FIRST_STEP)
        if first is None:
            return None
        spans.append((end_at - first.time, end_step - int(first.number("step", float(end_step)))))
    steps = sum(count for _, count in spans)
    return sum(seconds for seconds, _ in spans) / steps if steps >= 10 else None


def _kept_the_work(recovery: dict[str, Any]) -> bool:
    """The run resumed where it failed: from a survivor's state (warm), or from the checkpoint its
    ranks wrote on the scheduler's warning (a preemption, a walltime): nothing to roll back."""
    return recovery.get("state_source") == "peer" or (recovery["lost_steps"] == 0 and
                                                      recovery.get("failure_class") in ("PREEMPTED", "TIMEOUT"))
