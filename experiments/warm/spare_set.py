"""``restart.strategy: warm`` for TensorFlow and Chainer, whose collectives cannot drop a member: a
process of a warm spare set.

A set is one process per rank, launched together (one ``mpiexec``/``srun --mpi`` for Chainer, one
TF_CONFIG for TensorFlow), so that each process sets up in full before any fault: framework imported,
collective formed, model built, step traced. Then it tells the job's coordinator it is warm and
waits. The first set trains at once (generation 0); a later one when the coordinator hands it the
run after a failure (the active set retired: every rank restarts). It resumes from the newest valid
checkpoint like any restarted attempt, through the same runner, so a run resumed here ends bit for
bit as a resubmitted one; only the cold start is gone.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, replace
from typing import Any

from experiments.layout import ENV_WARM_ADDRESS, ENV_WARM_COORDINATOR, ENV_WARM_SET, RankJob, RunPaths
from experiments.runner import Runner, RunnerOptions
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fence import check_current, own_job_id
from experiments.runtime.identity import register_rank
from experiments.warm.member import WarmMember
from experiments.workloads import get_workload


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
        prepared_at = time.monotonic()
        timings = workload.setup(self.env, self.job.workload, self.options.timeouts)
        if self.slot >= self.env.world_size:  # a spare set: what a first step costs beyond a step, now
            workload.warm_up()
        timings["set_setup_s"] = time.monotonic() - prepared_at
        member = WarmMember(os.environ[ENV_WARM_COORDINATOR], self.slot, self.env.node,
                            os.environ.get(ENV_WARM_ADDRESS, self.env.node))
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
        # Generation 0 is the job's first attempt: its start-up is the process's, as a cold start's.
        runner = Runner(job, self.env, workload, self.options, time.time() if plan.generation else self.started_at)
        member.formed(plan.generation)  # the set's collective was formed at launch
        outcome = runner.run(prepared={f"prepared_{key}": value for key, value in timings.items()})
        member.done()
        return asdict(outcome)

