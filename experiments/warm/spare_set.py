"""``restart.strategy: warm`` for TensorFlow and Chainer, whose collectives cannot drop a member: a
process of a warm spare set.

A set is one process per rank, launched together (one ``mpiexec``/``srun --mpi`` for Chainer, one
TF_CONFIG for TensorFlow), so that each process sets up in full before any fault: framework imported,
collective formed, model built, step traced. Then it tells the job's coordinator it is warm and
waits. The first set trains at once (generation 0); a later one when the coordinator hands it the
run after a failure (every rank restarts). A later set takes the state of a survivor of the failed
set (held at the last step it completed, served over the job's authenticated state channel:
``state_channel.py``), so no step is lost; with no survivor holding one, it resumes from the newest
valid checkpoint like any restarted attempt. Either way through the same runner, so the run ends
bit for bit as an uninterrupted one.

Every member serves its own state once the coordinator tells it to hold. A member whose training
fails (its collective broke on a dead peer) holds at once, tells the coordinator the step it
completed, and waits to be retired: its state may be the one the next set takes.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import asdict, replace
from typing import Any

from experiments.layout import (
    ENV_WARM_ADDRESS,
    ENV_WARM_COORDINATOR,
    ENV_WARM_SECRET,
    ENV_WARM_SET,
    RankJob,
    RunPaths,
)
from experiments.runner import Runner, RunnerOptions
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fault_requests import InjectedRankError
from experiments.runtime.fence import check_current, own_job_id
from experiments.runtime.identity import register_rank
from experiments.runtime.session import RankSession
from experiments.warm.member import WarmMember
from experiments.warm.protocol import RESUME_PEER, Plan
from experiments.warm.state_channel import StateNotTaken, StateServer, fetch_state
from experiments.workloads import get_workload
from experiments.workloads.base import Workload


class WarmSetMember:
    def __init__(self, job: RankJob, env: DistEnv, paths: RunPaths, options: RunnerOptions, started_at: float) -> None:
        self.job, self.env, self.paths, self.options = job, env, paths, options
        self.started_at = started_at
        self.slot = int(os.environ.get(ENV_WARM_SET, "0")) * env.world_size + env.rank
        # The attempt this process works for, for its error report: the first set's from the start,
        # a spare set's once it is handed one (a spare set never used has none to blame).
        self.attempt: int | None = job.attempt if self.slot < env.world_size else None

    def run(self) -> dict[str, Any]:
        """Set up, wait for the coordinator, train the run if handed it; a spare never used returns."""
        workload = get_workload(self.job.workload.framework)
        servable = workload.serve_state()  # before set-up: each step's update gated apart from its all-reduce
        prepared_at = time.monotonic()
        timings = workload.setup(self.env, self.job.workload, self.options.timeouts)
        if self.slot >= self.env.world_size:  # a spare set: what a first step costs beyond a step, now
            workload.warm_up()
        timings["set_setup_s"] = time.monotonic() - prepared_at
        address = os.environ.get(ENV_WARM_ADDRESS, self.env.node)
        server = _state_server(workload, self.secret) if servable else None
        member = WarmMember(os.environ[ENV_WARM_COORDINATOR], self.slot, self.env.node, address,
                            state_port=server.port if server is not None else 0)
        plan = member.next_plan()
        if plan is None:
            workload.shutdown()
            return {"spare": self.slot, "used": False}
        if (plan.rank, plan.world_size) != (self.env.rank, self.env.world_size):
            raise RuntimeError(f"warm: slot {self.slot} is rank {self.env.rank} of {self.env.world_size} in its set; "
                               f"the plan made it rank {plan.rank} of {plan.world_size}")
        self.attempt = plan.attempt
        job = replace(self.job, attempt=plan.attempt)
        check_current(self.paths, plan.attempt, own_job_id(self.env.job_id), f"warm set rank {self.env.rank}",
                      drill_id=self.job.drill_id or None)
        register_rank(self.paths, self.env, plan.attempt)  # the injector may aim at this process now
        if server is not None:
            member.answer_holds(workload.gate.hold)
        # Generation 0 is the job's first attempt: its start-up is the process's, as a cold start's.
        runner = Runner(job, self.env, workload, self.options, time.time() if plan.generation else self.started_at)
        prepared = {f"prepared_{key}": value for key, value in timings.items()}
        try:
            if plan.resume == RESUME_PEER:  # formed once the state is taken: its source is retired then
                outcome = runner.run(prepared=prepared, resume=lambda session: self._take(session, workload, plan, member))
            else:
                member.formed(plan.generation)  # the set's collective was formed at launch
                outcome = runner.run(prepared=prepared)
        except InjectedRankError:
            raise  # this rank's own failure (the drill's rank-error): it ends
        except Exception as error:
            if server is None:
                raise
            _hold_and_wait(member, workload, plan, error)
            raise
        member.done()
        return asdict(outcome)

    @property
    def secret(self) -> str:
        return os.environ.get(ENV_WARM_SECRET, "")

    def _take(self, session: RankSession, workload: Workload, plan: Plan, member: WarmMember) -> int:
        """The held survivor's state, as the plan names it; the coordinator hears "formed" once it is in."""
        started = time.monotonic()
        arrays = fetch_state(plan.source_address, plan.source_port, self.secret, plan.step)
        workload.take_peer_state(arrays, plan.step)
        assert plan.source_rank is not None
        session.took_state(plan.step, time.monotonic() - started, plan.source_rank)
        member.formed(plan.generation)
        return plan.step


def _state_server(workload: Workload, secret: str) -> StateServer | None:
    """This member's state channel, in a job with a secret. None where it cannot listen (the next
    set then takes another's state, or the checkpoint)."""
    if not secret:
        return None
    gate = workload.gate
    try:
        return StateServer(secret, lambda: (gate.completed, workload.peer_state()), held=lambda: gate.held)
    except OSError as error:
        sys.stderr.write(f"faultdrill: warm: this member cannot serve its state ({error}): a set after a failure "
                         "here resumes from another survivor or the checkpoint\n")
        return None


def _hold_and_wait(member: WarmMember, workload: Workload, plan: Plan, error: Exception) -> None:
    """Training failed here (a collective broke on a dead peer, or the state could not be taken):
    the state is held at the step this member completed, the coordinator told, and the member
    waits to be retired (the coordinator's connection ends) while it serves that state."""
    traceback.print_exception(error, file=sys.stderr)
    step = workload.gate.hold()
    sys.stderr.write(f"faultdrill: warm set rank {plan.rank}: training failed after step {step}; its state is "
                     "held for the next set, this process waits to be retired\n")
    member.lost(plan.generation, step, why=f"{type(error).__name__}: {error}",
                source_failed=isinstance(error, StateNotTaken))
    member.released.wait()
