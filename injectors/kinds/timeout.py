"""timeout: the job reaches its walltime, the everyday end of a long training split into chained
jobs. On Slurm the fault moves the running job's time limit to about ``in_s`` from now (Slurm keeps
limits in whole minutes and enforces them at a periodic check, so the end comes up to a minute or
so later); PBS moves no running job's walltime (``qalter -l walltime`` is for queued jobs; the
wrappers' qalter takes no ``-l``), so there the job reaches the walltime its spec gave
(``resources.time``, short for the drill). The warning comes ``resources.warning_s`` before the
end (Slurm's ``--signal``; on PBS the batch script sends it), the ranks checkpoint and wait, the
job ends TIMEOUT and the run goes on in a new job. The fault's time is when the ranks got the
warning (or, without one, when the job ended)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from injectors.kinds.base import FaultKind, FaultOptions, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.kinds.scheduler_end import saved, wait_for_job_end, warned_event
from injectors.targets import TargetRefused

END_DEADLINE_S = 240.0  # beyond in_s: a minute's rounding, slurmctld's periodic check, KillWait


class TimeoutOptions(FaultOptions):
    kind: Literal["timeout"] = "timeout"
    in_s: float = Field(30.0, ge=1, le=3600, description=(
        "the walltime is reached about this long after the fault (Slurm; on PBS the job's own walltime)"))


class Timeout(FaultKind):
    name = "timeout"
    target = Target.JOB
    site = Site.CONTROLLER
    options = TimeoutOptions
    works_on = ("slurm", "pbs")

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return f"job (walltime in ~{float(options.get('in_s', 30.0)):g} s)"

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        control.verify_running()
        moved_at = time.time()
        walltime = control.set_time_left(float(task.options.get("in_s", 30.0)))
        what = walltime.said
        ended_at = wait_for_job_end(control, walltime.ends_within_s + END_DEADLINE_S)
        if ended_at is None:
            raise TargetRefused(f"job {control.job_id} still runs {END_DEADLINE_S:.0f} s past its walltime ({what})")
        # Any warning of this attempt: on PBS it may have come before the fault fired.
        warned = warned_event(task, 0.0)
        at = warned.received_at if warned is not None else ended_at
        warning = (f"warned {ended_at - warned.received_at:.1f} s before the end; {saved(warned, warned.received_at)}"
                   if warned is not None else "no warning reached the ranks")
        return FaultOutcome(kind=self.name, target=f"job {control.job_id}", at=at,
                            detail=f"{what}; ended {ended_at - moved_at:.1f} s later; {warning}")
