"""The built-in training loop under ``restart.strategy: warm`` (PyTorch): every process of the job
builds its model, then waits for the coordinator's plan; a rank trains, a spare waits.

When a collective fails (a peer died: gloo raises; a hung peer: the collective's timeout), the
rank drops the step it was in (its optimizer never stepped on a partial gradient), leaves its
process group, tells the coordinator the last step it completed and waits for the next plan: a new
group with a warm spare in the dead rank's place, the state broadcast by the survivor with the
highest step, the interrupted step redone. No rollback to a checkpoint unless no survivor is left.
Each generation is the run's next attempt (the coordinator fenced it): its own timeline of events,
heartbeats and identity files, as a restarted job's would be. Checkpoints are taken synchronously
here (a background commit would wait for a dead rank's share).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

from experiments.layout import NCCL_PEER_LOSS_MARKERS, RankJob, RunPaths
from experiments.runner import RunnerOptions, RunOutcome
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fault_requests import InjectedRankError
from experiments.runtime.identity import leave_attempt, register_rank
from experiments.runtime.session import RankSession
from experiments.runtime.snapshot import Snapshot
from experiments.warm.member import WarmMember
from experiments.warm.protocol import RESUME_PEER, Plan
from experiments.workloads.torch_workload import TorchWorkload

# What a survivor's collective says when a peer is gone (gloo: its socket closed, or the timeout; a
# peer whose node lost power sends nothing: gloo then ends the pair with "Application timeout caused
# pair closure"), compared in lower case.
PEER_LOST_MARKERS = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "socket",
                     "pair closure", "no route to host", "gloo", "peer",
                     *(marker.lower() for marker in NCCL_PEER_LOSS_MARKERS))


class GroupLost(RuntimeError):
    """A collective of this generation failed: the step in progress is dropped."""


def _lost_or_raise(error: Exception) -> NoReturn:
    """GroupLost for a collective that failed (the group re-forms); anything else is this rank's own error."""
    if peer_lost(error):
        raise GroupLost(str(error)) from error
    raise error


def peer_lost(error: BaseException) -> bool:
    if isinstance(error, InjectedRankError):  # this rank's own (rank-error), whatever its message says
        return False
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(marker in str(error).lower() for marker in PEER_LOST_MARKERS))


class WarmRunner:
    def __init__(self, job: RankJob, env: DistEnv, workload: TorchWorkload, member: WarmMember,
                 options: RunnerOptions, started_at: float) -> None:
        self.job, self.env, self.workload, self.member = job, env, workload, member
        self.options = replace(options, async_persist=False)
        self.started_at = started_at
        self.completed = 0  # the last step this process completed (its optimizer stepped)
        self.attempt, self.rank = job.attempt, env.rank  # where this process stands (for its error report)

    def run(self) -> RunOutcome | None:
        """Train as the coordinator plans until the run completes; None for a spare never used."""
        while (plan := self.member.next_plan()) is not None:
            self.attempt, self.rank = plan.attempt, plan.rank
            try:
                return self._generation(plan)
            except GroupLost as error:
                leave_attempt(RunPaths(Path(self.job.run_dir)), plan.rank, plan.attempt)
                self.workload.leave()
                self.member.lost(plan.generation, self.completed, why=str(error))
        return None

    def _generation(self, plan: Plan) -> RunOutcome:
        env = replace(self.env, rank=plan.rank, world_size=plan.world_size, master_addr=plan.master_addr,
                      master_port=plan.master_port)
        job = replace(self.job, attempt=plan.attempt)
        # Generation 0 starts with the process; a later one when its plan came (the spare was waiting).
        session = RankSession(job, env, self.workload, self.workload.checkpoint_meta, self.options,
                              self.started_at if plan.generation == 0 else time.time())
        register_rank(session.paths, env, plan.attempt)  # the injector may aim at this process now
        session.started()
        timeouts = self.options.timeouts
        if plan.join_timeout_s is not None:  # a re-formation: every member is warm, a dead one voids it
            timeouts = replace(timeouts, rendezvous_s=min(timeouts.rendezvous_s, plan.join_timeout_s))
        try:
            joined = time.monotonic()
            self.workload.join(env, timeouts, host_store=not plan.store_hosted)
            session.ready(determinism=self.workload.determinism, rendezvous_s=time.monotonic() - joined)
            self._resume(plan, session)
            self.workload.wrap()
        except Exception as error:
            _lost_or_raise(error)
        self.member.formed(plan.generation)
        return self._train(plan, session)

    def _resume(self, plan: Plan, session: RankSession) -> None:
        if plan.resume == RESUME_PEER:
            assert plan.source_rank is not None
            started = time.monotonic()
            self.workload.share_state(plan.source_rank, plan.step)
            session.took_state(plan.step, time.monotonic() - started, plan.source_rank)
            self.completed = plan.step
        else:
            found = session.resume(self.workload.load)
            self.completed = found.step if found else 0

    def _train(self, plan: Plan, session: RankSession) -> RunOutcome:
        total = self.job.workload.steps
        try:
            for step in range(self.completed + 1, total + 1):
                step_started = time.monotonic()
                loss = self.workload.paced_step(step, self.job.workload.step_s)
                self.completed = step
                session.stepped(step, loss, step_s=time.monotonic() - step_started)
                checkpoint_due = session.checkpoint_due(step)
                if checkpoint_due:
                    session.checkpoint(step, self._snapshot(step))
                if step < total and session.warning_agreed(step):
                    self._hold_on_warning(plan, session, step, checkpoint_due)
            final = max(self.completed, total)
            digest = session.finish(final, self.workload.digest, self.workload.named_weights)
        except Exception as error:
            _lost_or_raise(error)
        self.member.done()
        self.workload.leave()
        return RunOutcome(rank=plan.rank, final_step=final, resumed_from=plan.step, digest=digest)

    def _hold_on_warning(self, plan: Plan, session: RankSession, step: int, saved: bool) -> NoReturn:
        """The scheduler's warning, agreed at ``step``: save it, tell the coordinator (this rank's
        end is then no failure to re-form from), wait for the scheduler to end the job."""
        session.checkpoint_on_warning(step, None if saved else self._snapshot(step))
        self.member.warned(plan.generation, step)
        session.hold(step)

    def _snapshot(self, step: int) -> Snapshot:
        return lambda sink: self.workload.snapshot(sink, step)
