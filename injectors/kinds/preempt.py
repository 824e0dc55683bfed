"""preempt: the scheduler takes the job back as sites do: the warning signal to every rank (the
one the batch script's ``--signal`` names), a grace time, then the job is cancelled (or, with
``then: requeue``, requeued: ``scontrol requeue``, as sites that requeue preempted jobs do). The ranks
take a checkpoint on the warning and train no more, so the work lost should be ~0; the run goes
on in a new job. Acts from the controller, through the scheduler (Slurm: ``scancel --signal``,
then ``scancel``; PBS, which has no qsig here, and local: the agent signals the verified ranks on
their nodes, then the job is deleted: ``qdel``, as a PBS preemption by kill does)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from experiments.runtime.warning import DEFAULT_WARNING_SIGNAL
from injectors.kinds.base import FaultKind, FaultOptions, FaultOutcome, FaultTask, JobControl, Site, Target
from injectors.kinds.scheduler_end import saved, wait_for_warned

# A warned event counts from this long before the signal (both on the login clock): room for the
# bounds of rank 0's clock reading.
WARNED_SLACK_S = 1.0


class PreemptOptions(FaultOptions):
    kind: Literal["preempt"] = "preempt"
    grace_s: float = Field(30.0, ge=0, le=3600, description=(
        "the longest the job is given after the warning; it is cancelled as soon as its ranks' "
        "checkpoint is durable, or at the end of the grace time"))
    then: Literal["cancel", "requeue"] = Field("cancel", description=(
        "what the scheduler does after the grace time: cancel the job, or requeue it (Slurm)"))


class Preempt(FaultKind):
    name = "preempt"
    target = Target.JOB
    site = Site.CONTROLLER
    options = PreemptOptions
    works_on = ("local", "slurm", "pbs")

    def backend_problem(self, options: FaultOptions, backend: str) -> str | None:
        if getattr(options, "then", "cancel") == "requeue" and backend != "slurm":
            return (f"preempt then: requeue needs a scheduler that requeues a running job (slurm: scontrol "
                    f"requeue); the {backend} backend cannot here: use then: cancel")
        return None

    def describe(self, ranks: tuple[int, ...], options: dict[str, Any]) -> str:
        return (f"job (warning {DEFAULT_WARNING_SIGNAL}, grace {float(options.get('grace_s', 30.0)):g} s, "
                f"then {options.get('then', 'cancel')})")

    def act_on_controller(self, task: FaultTask, control: JobControl) -> FaultOutcome:
        control.verify_running()
        at = time.time()
        control.signal_ranks(DEFAULT_WARNING_SIGNAL)
        warned = wait_for_warned(task, at - WARNED_SLACK_S, float(task.options.get("grace_s", 30.0)))
        then = str(task.options.get("then", "cancel"))
        # Still this attempt's job? In the grace time the ranks may have exited and the job gone on
        # as the next attempt (in-allocation, warm): that one is not the preemption's to end.
        control.verify_running()
        control.requeue() if then == "requeue" else control.cancel()
        waited = time.time() - at
        done = "requeued" if then == "requeue" else "cancelled"
        return FaultOutcome(kind=self.name, target=f"job {control.job_id}", at=at, signal=DEFAULT_WARNING_SIGNAL,
                            detail=f"preempted: {saved(warned, at)}; {done} {waited:.2f} s after the warning")
