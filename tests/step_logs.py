"""What a script really did, from the step log experiments/examples/torchrun_ddp.py writes with
``--step-log`` (``<pid> <step> <time>`` per step a rank ran), held against a drill's report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PIPE_LAG_STEPS = 2  # step lines still in the pipe when the fault came are seen after it (zero-code)


@dataclass(frozen=True)
class Step:
    pid: int
    step: int
    at: float


def executed(log: Path) -> list[Step]:
    return [Step(int(pid), int(step), float(at)) for pid, step, at in (line.split() for line in log.read_text().splitlines())]


def check_one_recovery(run: dict[str, Any], run_dir: Path, every: int) -> None:
    """The run's one recovery against rank 0's log: it resumed from the script's own newest
    checkpoint of the failed attempt, lost the steps reached before the fault past it (fewer only
    by the lines still in the pipe), and the failed attempt's workers trained no step once the
    next attempt had begun."""
    steps = executed(run_dir / "steps-0.log")
    failed_pid = steps[0].pid
    failed = [step for step in steps if step.pid == failed_pid]
    later = [step for step in steps if step.pid != failed_pid]
    [recovery] = run["recoveries"]
    newest_checkpoint = max(step.step for step in failed) // every * every
    assert later[0].step == newest_checkpoint + 1, (later[0], newest_checkpoint)
    assert recovery["resumed_from_step"] == newest_checkpoint, recovery
    reached = max(step.step for step in failed if step.at <= recovery["fault_at"])
    expected = reached - newest_checkpoint
    assert expected - PIPE_LAG_STEPS <= recovery["lost_steps"] <= expected, (recovery, reached)
    assert max(step.at for step in failed) < later[0].at, "the failed attempt trained on beside the next"
