"""The fence a warm job's coordinator holds: each new generation moves the run to its next attempt
by compare-and-set over the attempt the job holds. When the controller has moved the fence on (it
took the job for hung and replaced it, or cancelled it), the coordinator ends the job instead of
overwriting the controller's newer fence, which would refuse the controller's next job as stale."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.layout import RunPaths
from experiments.runtime.fence import Fence, StaleAttemptError, advance_fence
from experiments.warm.coordinator import CoordinatorGaveUp


@dataclass
class HeldFence:
    paths: RunPaths
    held: Fence  # the attempt this job runs now (the controller fenced the first one)

    def advance(self, attempt: int) -> None:
        new = Fence(attempt, self.held.job_id, self.held.drill_id)
        try:
            advance_fence(self.paths, self.held, new)
        except StaleAttemptError as error:
            raise CoordinatorGaveUp(f"warm: the run moved on without this job ({error})") from error
        self.held = new
