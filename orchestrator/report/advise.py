"""Checkpoint interval advice (``faultdrill advise``): Young's and Daly's optimal intervals from a
checkpoint cost and a mean time between failures, in seconds and in steps, and the goodput each
predicts.

Definitions (as in Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22, 2006; Young, CACM 17, 1974), with failures a Poisson process of mean ``M``:
- ``delta``: what one checkpoint costs the training (the rank is held that long: the store's
  blocking time; with async persist only the copy-out, not the write);
- ``R``: the time from a failure to training again (the drill's time to recover);
- Young: ``tau = sqrt(2 delta M)``; Daly: ``tau = sqrt(2 delta M) (1 + sqrt(x)/3 + x/9) - delta``
  with ``x = delta / (2M)``, for ``delta < 2M`` (else ``tau = M``);
- goodput (useful time / wall time) of a compute interval ``tau``, Daly's model:
  ``tau / (M e^(R/M) (e^((tau + delta)/M) - 1))``; lost work per failure ~ ``tau / 2``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.report.document import build_report


class AdviceError(ValueError):
    """The inputs cannot give advice (named, with what is valid)."""


@dataclass(frozen=True)
class AdviceInputs:
    checkpoint_s: float  # delta
    mtbf_s: float  # M
    restart_s: float = 0.0  # R
    step_s: float | None = None  # one training step, to say the intervals in steps
    every_steps: int | None = None  # the interval the drill used (checkpoint.every_steps), to compare
    source: str = "given"  # where delta, R and the step time came from

    def __post_init__(self) -> None:
        if not (self.checkpoint_s > 0 and math.isfinite(self.checkpoint_s)):
            raise AdviceError(f"the checkpoint cost must be a positive number of seconds (got {self.checkpoint_s})")
        if not (self.mtbf_s > 0 and math.isfinite(self.mtbf_s)):
            raise AdviceError(f"the MTBF must be a positive number of seconds (got {self.mtbf_s})")
        if self.restart_s < 0:
            raise AdviceError(f"the restart time must be >= 0 seconds (got {self.restart_s})")
        if self.step_s is not None and not self.step_s > 0:
            raise AdviceError(f"the step time must be a positive number of seconds (got {self.step_s})")
        if self.every_steps is not None and (self.every_steps < 1 or self.step_s is None):
            raise AdviceError("the interval in use (--every-steps) must be >= 1 step, with the step time known")


@dataclass(frozen=True)
class Interval:
    rule: str  # "Young" | "Daly" | "in use" (the drill's own interval)
    seconds: float  # compute time between the ends of two checkpoints' blocking parts
    steps: int | None  # the same in training steps (at least 1), if the step time is known
    goodput: float  # predicted useful fraction of the wall time
    lost_per_failure_s: float  # expected work lost per failure: half an interval


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    if checkpoint_s >= 2 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2 * mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def predicted_goodput(interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Daly's expected useful fraction of the wall time, checkpointing every ``interval_s`` of work."""
    return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + checkpoint_s) / mtbf_s))


def advise(inputs: AdviceInputs) -> list[Interval]:
    """Young's and Daly's intervals, and the one in use if known, each with what it predicts."""
    rules = [("Young", young_interval(inputs.checkpoint_s, inputs.mtbf_s)),
             ("Daly", daly_interval(inputs.checkpoint_s, inputs.mtbf_s))]
    if inputs.every_steps is not None and inputs.step_s is not None:
        rules.append(("in use", inputs.every_steps * inputs.step_s))
    intervals = []
    for rule, seconds in rules:
        steps = max(1, round(seconds / inputs.step_s)) if inputs.step_s else None
        intervals.append(Interval(rule, seconds, steps,
                                  predicted_goodput(seconds, inputs.checkpoint_s, inputs.mtbf_s, inputs.restart_s),
                                  seconds / 2))
    return intervals


def inputs_from_workdir(workdir: Path, mtbf_s: float, restart_s: float | None = None) -> AdviceInputs:
    """delta, R and the step time measured by a drill (its ledger): the mean checkpoint blocking
    time, time to recover and step time over its faulted runs (twins count for checkpoints and steps)."""
    report = build_report(workdir)
    runs = report["runs"]
    every = {run["checkpoint_every_steps"] for run in runs} - {None}
    blocking = [run["checkpoints"]["mean_blocking_s"] for run in runs if run["checkpoints"]["count"]]
    if not blocking:
        raise AdviceError(f"{workdir}: no run of this drill wrote a checkpoint; give the cost with --cost SECONDS")
    steps = [run["step_time_s"] for run in runs if run["step_time_s"]]
    ttrs = [recovery["ttr_s"] for run in runs for recovery in run["recoveries"]]
    measured_restart = statistics.fmean(ttrs) if ttrs else 0.0
    return AdviceInputs(checkpoint_s=statistics.fmean(blocking), mtbf_s=mtbf_s,
                        restart_s=measured_restart if restart_s is None else restart_s,
                        step_s=statistics.fmean(steps) if steps else None,
                        every_steps=every.pop() if len(every) == 1 and steps else None,
                        source=f"{workdir}: {len(blocking)} run(s) with checkpoints, {len(ttrs)} recovery(ies)")


def advice_document(inputs: AdviceInputs) -> dict[str, Any]:
    return {"inputs": asdict(inputs), "intervals": [asdict(interval) for interval in advise(inputs)]}
