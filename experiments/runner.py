"""The framework-agnostic training loop of the built-in workloads.

A workload only trains, saves, loads and digests; everything a drill measures (timeline, resume
from the newest valid checkpoint, checkpoint cadence and two-phase write, heartbeats, the loss log,
the warning, the final record) is the ``RankSession``'s, the same one a user's script gets through
the rank API (``experiments/runtime/api.py``).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

from experiments.layout import RankJob
from experiments.runtime.distenv import DistEnv
from experiments.runtime.session import RankSession, SessionOptions, save_weights  # noqa: F401
from experiments.runtime.snapshot import Snapshot
from experiments.workloads.base import Workload

# The runner's options are the session's (timeouts, async persist, the warning and its hold).
RunnerOptions = SessionOptions
Resume = Callable[[RankSession], int]  # the state put in place some other way: the step it holds


@dataclass(frozen=True)
class RunOutcome:
    rank: int
    final_step: int
    resumed_from: int  # 0: cold start
    digest: str


class Runner:
    """The built-in training loop: the workload trains, the session keeps the books."""

    def __init__(
        self, job: RankJob, env: DistEnv, workload: Workload, options: RunnerOptions, started_at: float
    ) -> None:
        self.job, self.env, self.workload = job, env, workload
        # The workload's own collectives: the ranks already share its process group.
        self.session = RankSession(job, env, workload, workload.checkpoint_meta, options, started_at)

    def run(self, prepared: dict[str, float] | None = None, resume: Resume | None = None) -> RunOutcome:
        """``prepared``: the workload was set up before this attempt began (a warm spare set: its
        collective formed, model built, step traced, then it waited); its set-up's timings.
        ``resume``: where the state comes from instead of the newest valid checkpoint (a warm set
        taking a survivor's); the step it holds."""
        session = self.session
        session.started()
        timings = prepared if prepared is not None else self.workload.setup(self.env, self.job.workload,
                                                                             session.options.timeouts)
        session.ready(determinism=self.workload.determinism, **timings)
        if resume is not None:
            start_step = resume(session)
        else:
            found = session.resume(self.workload.load)
            start_step = found.step if found else 0
        warned_at = self._train(start_step)
        if warned_at is not None:
            session.hold(warned_at)
        final_step = max(start_step, self.job.workload.steps)
        digest = session.finish(final_step, self.workload.digest, self.workload.named_weights)
        self.workload.shutdown()
        return RunOutcome(rank=self.env.rank, final_step=final_step, resumed_from=start_step, digest=digest)

    def _train(self, start_step: int) -> int | None:
        """Train to the last step; the step at which the scheduler's warning stopped it, if it did."""
        session, total = self.session, self.job.workload.steps
        for step in range(start_step + 1, total + 1):
            step_started = time.monotonic()
            loss = self.workload.paced_step(step, self.job.workload.step_s)
            session.stepped(step, loss, step_s=time.monotonic() - step_started)
            checkpoint_due = session.checkpoint_due(step)
            if checkpoint_due:
                session.checkpoint(step, self._snapshot(step))
            if step < total and session.warning_agreed(step):
                session.checkpoint_on_warning(step, None if checkpoint_due else self._snapshot(step))
                return step
        return None

    def _snapshot(self, step: int) -> Snapshot:
        """The workload's capture of its state; a synchronous checkpoint's writes the state as it
        stands (training waits for it: a workload need not copy it first)."""
        if self.session.options.async_persist:
            return lambda sink: self.workload.snapshot(sink, step)
        return lambda sink: functools.partial(self.workload.save, sink, step)


def run_training(
    job: RankJob, env: DistEnv, workload: Workload, started_at: float, options: RunnerOptions | None = None
) -> RunOutcome:
    """Run (or resume) one attempt of one run on this rank; raises if any rank fails."""
    return Runner(job, env, workload, options or RunnerOptions(), started_at).run()
