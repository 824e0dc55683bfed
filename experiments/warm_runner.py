"""The built-in training loop under ``restart.strategy: warm`` (PyTorch): every process of the job
builds its model, then waits for the coordinator's plan; a rank trains, a spare waits.

When a collective fails (a peer died: gloo raises; a hung peer: the collective's timeout), the
rank drops the step it was in (its optimizer never stepped on a partial gradient), leaves its
process group, tells the coordinator the last step it completed and waits for the next plan: a new
group with a warm spare in the dead rank's place, the state broadcast by the survivor with the
highest step, the interrupted step redone. No rollback to a checkpoint unless no survivor is left.
Checkpoints are taken synchronously here (a background commit would wait for a dead rank's share).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch.distributed as dist

from experiments.layout import RankJob
from experiments.runner import RunOutcome, RunnerOptions
from experiments.runtime.distenv import DistEnv
from experiments.runtime.identity import write_identity
from experiments.runtime.session import RankSession
from experiments.runtime.warm.member import WarmMember
from experiments.runtime.warm.protocol import RESUME_PEER, Plan
from experiments.workloads.torch_workload import TorchWorkload

# What a survivor's failed collective raises (gloo: a peer's socket closed, or the collective's timeout).
COLLECTIVE_FAILURES = (dist.DistError, RuntimeError)


class GroupLost(RuntimeError):
    """A collective of this generation failed: the step in progress is dropped."""


class WarmRunner:
    def __init__(self, job: RankJob, env: DistEnv, workload: TorchWorkload, member: WarmMember,
                 options: RunnerOptions, started_at: float) -> None:
        self.job, self.env, self.workload, self.member = job, env, workload, member
        self.options = replace(options, async_persist=False)
        self.started_at = started_at
        self.session: RankSession | None = None
        self.completed = 0  # the last step this process completed (its optimizer stepped)

    def run(self) -> RunOutcome | None:
        """Train as the coordinator plans until the run completes; None for a spare never used."""
        while (plan := self.member.next_plan()) is not None:
            try:
                return self._generation(plan)
            except GroupLost:
                self.workload.leave()
                self.member.lost(plan.generation, self.completed)
        return None

    def _generation(self, plan: Plan) -> RunOutcome:
        env = replace(self.env, rank=plan.rank, world_size=plan.world_size, master_addr=plan.master_addr,
                      master_port=plan.master_port)
        session = self._session(env)
        started = time.monotonic()
        try:
            self.workload.join(env, self.options.timeouts)
            joined = time.monotonic()
            if plan.resume == RESUME_PEER:
                assert plan.source_rank is not None
                self.workload.share_state(plan.source_rank, plan.step)
                self.completed = plan.step
            else:
                found = session.resume(self.workload.load)
                self.completed = found.step if found else 0
            self.workload.wrap()
        except COLLECTIVE_FAILURES as error:
            raise GroupLost(str(error)) from error
        self.member.formed(plan.generation, rendezvous_s=joined - started, transfer_s=time.monotonic() - joined)
        return self._train(plan, session)

    def _session(self, env: DistEnv) -> RankSession:
        """The rank's bookkeeping: made once this process has a rank (a spare's, at its first plan)."""
        if self.session is None or self.session.env.rank != env.rank:
            self.session = RankSession(self.job, env, self.workload, self.workload.checkpoint_meta, self.options,
                                       self.started_at)
            write_identity(self.session.paths, env, self.job.attempt)  # the injector may aim at it now
            self.session.started()
            self.session.ready(determinism=self.workload.determinism)
        self.session.env = env
        return self.session

    def _train(self, plan: Plan, session: RankSession) -> RunOutcome:
        total = self.job.workload.steps
        try:
            for step in range(self.completed + 1, total + 1):
                step_started = time.monotonic()
                loss = self.workload.train_step(step)
                self.completed = step
                session.stepped(step, loss, step_s=time.monotonic() - step_started)
                if step == plan.step + 1 and plan.generation > 0 and env_is_main(session):
                    self.member.stepped(plan.generation, step)
                if session.checkpoint_due(step):
                    session.checkpoint(step, lambda sink, at=step: self.workload.snapshot(sink, at))
            final = max(self.completed, total)
            digest = session.finish(final, self.workload.digest, self.workload.named_weights)
        except COLLECTIVE_FAILURES as error:
            raise GroupLost(str(error)) from error
        self.member.done()
        self.workload.leave()
        return RunOutcome(rank=plan.rank, final_step=final, resumed_from=plan.step, digest=digest)


def env_is_main(session: RankSession) -> bool:
    return session.env.is_main
