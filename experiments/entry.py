"""What the orchestrator launches on every task of a job: ``run_rank(job)``.

Submitted through submitit (each task of the job unpickles and calls it), or run as
``python -m experiments.entry --job job.json`` from a batch script without submitit.
Thread limits are set before any framework is imported: they are read once, at import.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from experiments.layout import (  # noqa: F401
    ENV_ASYNC_PERSIST,
    ENV_ATTEMPT,
    ENV_WARM_COORDINATOR,
    RankJob,
    RunPaths,
    rank_job_from_dict,
    rank_job_to_dict,
    write_json_atomic,
)
from experiments.runtime.rank_error import record_rank_error
from experiments.runtime.warning import WarningNote, hold_seconds, warning_signal
from experiments.threads import limit_threads

if TYPE_CHECKING:  # the rank's modules load late: a rank's start-up time is measured
    from experiments.runtime.distenv import DistEnv
    from experiments.workloads.torch_workload import TorchWorkload



def run_rank(job: RankJob) -> dict[str, Any]:
    """Run this task's rank of ``job`` to the end; raises (non-zero exit) if any rank fails.

    Returns ``{"rank", "final_step", "digest", "resumed_from"}`` on every rank (the weights, so
    the digest, are the same on all ranks; submitit's ``job.result()`` is rank 0's).
    """
    started_at = time.time()
    limit_threads()
    # submitit makes a task ignore SIGTERM (it waits for a preemption signal instead). A drill rank
    # must die on it: when one rank dies, srun and mpiexec end the others with SIGTERM and only
    # send SIGKILL after a grace time (Slurm's KillWait), which would pad every detection time.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The scheduler's warning (walltime near, preemption) is the runner's, not submitit's (whose
    # handler ends rank 0 with an error): noted here, acted on at an agreed step.
    warning = WarningNote(warning_signal()).install()
    # Imported here, not at module top: the framework must see the thread limits above.
    from experiments.runtime.distenv import DistEnv
    from experiments.runtime.fence import check_current, own_job_id

    env = DistEnv.from_environ()
    job = attempt_from_environment(job)
    paths = RunPaths(Path(job.run_dir))
    # Before this rank touches any of the run's files: a stale attempt (a scheduler's requeue, a
    # duplicate, an orphan) must leave them to the current one.
    check_current(paths, job.attempt, own_job_id(env.job_id), f"starting rank {env.rank}", drill_id=job.drill_id or None)
    if job.workload.command is not None:  # the user's script: none of the built-in runner's modules (NumPy)
        return _run_command(job, env, paths, started_at)
    from experiments.runner import RunnerOptions, run_training
    from experiments.runtime.distenv import Timeouts
    from experiments.runtime.identity import register_rank
    from experiments.workloads import get_workload

    if os.environ.get(ENV_WARM_COORDINATOR):
        return _run_warm(job, env, paths, started_at, warning)
    register_rank(paths, env, job.attempt)
    workload = get_workload(job.workload.framework)
    options = RunnerOptions(
        timeouts=Timeouts.from_environ(), async_persist=os.environ.get(ENV_ASYNC_PERSIST, "1") != "0",
        warning=warning, warning_hold_s=hold_seconds(),
    )
    try:
        outcome = run_training(job, env, workload, started_at, options)
    except Exception as error:
        record_rank_error(paths, job.attempt, env.rank, error)
        atexit.register(gc.freeze)
        raise
    except BaseException:
        # A survivor's exit is what ends a local job and what the controller detects. Tearing
        # down torch's module graph at exit costs ~1 s; frozen objects are skipped by the final
        # collections (the OS reclaims them), which makes the exit ~4x faster.
        atexit.register(gc.freeze)
        raise
    return asdict(outcome)


def _run_command(job: RankJob, env: "DistEnv", paths: RunPaths, started_at: float) -> dict[str, Any]:
    """The user's script as this rank (experiments/runtime/command.py): its child registers as the rank."""
    from experiments.layout import SIGNAL_EXIT_BASE
    from experiments.runtime.command import CommandFailed, run_command

    try:
        return run_command(job, env, started_at)
    except Exception as error:
        signalled = isinstance(error, CommandFailed) and error.exit_code > SIGNAL_EXIT_BASE
        # The script's own account wins; a script that ended as a signal's victim (a wrapper's 137)
        # said nothing of its own: its exit code is the evidence, not an error it raised.
        if not signalled and not paths.rank_error_file(job.attempt, env.rank).exists():
            record_rank_error(paths, job.attempt, env.rank, error)
        if isinstance(error, CommandFailed) and error.exit_code != 1:
            # The rank ends with the script's own code (an exception would make it 1), and says why.
            print(f"faultdrill: rank {env.rank}: {error}", file=sys.stderr, flush=True)
            raise SystemExit(error.exit_code) from error
        raise


def _run_warm(job: RankJob, env: "DistEnv", paths: RunPaths, started_at: float, warning: WarningNote) -> dict[str, Any]:
    """restart.strategy warm (experiments/warm/runner.py): this process builds its model, tells the
    job's coordinator it is warm, and trains as a rank or waits as a spare."""
    from experiments.layout import ENV_WARM_ADDRESS, ENV_WARM_SLOT
    from experiments.runner import RunnerOptions
    from experiments.runtime.distenv import Timeouts
    from experiments.warm.member import WarmMember
    from experiments.warm.protocol import RESTART_ALL_FRAMEWORKS
    from experiments.warm.runner import WarmRunner
    from experiments.workloads import get_workload

    if job.workload.framework in RESTART_ALL_FRAMEWORKS:
        return _run_warm_set(job, env, paths, started_at, warning)
    slot = int(os.environ.get(ENV_WARM_SLOT, env.rank))
    # One warm process per rank: PyTorch alone (the frameworks above restart all, as spare sets).
    workload = cast("TorchWorkload", get_workload(job.workload.framework))
    workload.build(job.workload)
    member = WarmMember(os.environ[ENV_WARM_COORDINATOR], slot, env.node, os.environ.get(ENV_WARM_ADDRESS, env.node))
    options = RunnerOptions(timeouts=Timeouts.from_environ(), async_persist=False, warning=warning,
                            warning_hold_s=hold_seconds())
    runner = WarmRunner(job, env, workload, member, options, started_at)
    try:
        outcome = runner.run()
    except Exception as error:
        record_rank_error(paths, runner.attempt, runner.rank, error)
        raise
    return asdict(outcome) if outcome is not None else {"spare": slot, "used": False}


def _run_warm_set(job: RankJob, env: "DistEnv", paths: RunPaths, started_at: float, warning: WarningNote) -> dict[str, Any]:
    """restart.strategy warm, TensorFlow and Chainer (experiments/warm/spare_set.py): a process of a warm
    spare set, which trains the run when the coordinator hands it to its set."""
    from experiments.runner import RunnerOptions
    from experiments.runtime.distenv import Timeouts
    from experiments.runtime.fault_requests import InjectedRankError
    from experiments.warm.spare_set import WarmSetMember

    options = RunnerOptions(timeouts=Timeouts.from_environ(), async_persist=os.environ.get(ENV_ASYNC_PERSIST, "1") != "0",
                            warning=warning, warning_hold_s=hold_seconds())
    member = WarmSetMember(job, env, paths, options, started_at)
    try:
        return member.run()
    except Exception as error:
        if member.attempt is not None:
            record_rank_error(paths, member.attempt, env.rank, error)
        if isinstance(error, InjectedRankError):  # the drill's rank-error: this rank alone ends
            _exit_alone(error)
        atexit.register(gc.freeze)
        raise


def _exit_alone(error: BaseException) -> NoReturn:
    """End this process now, with its traceback and exit code 1, skipping the interpreter's exit
    hooks: a Chainer rank's MPI_Abort at exit (experiments/workloads/chainer_workload.py) would end
    its whole set, whose survivors must live on to serve their state to the next set."""
    traceback.print_exception(error, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def attempt_from_environment(job: RankJob) -> RankJob:
    """The attempt the batch script launched these ranks as: a job that relaunches its ranks in its
    own allocation (restart.strategy in-allocation) runs one pickled job for several attempts."""
    named = os.environ.get(ENV_ATTEMPT)
    if named is None or not named.isdigit() or int(named) == job.attempt:
        return job
    return replace(job, attempt=int(named))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one rank of a Faultdrill run.")
    parser.add_argument("--job", required=True, type=Path, help="RankJob as JSON (rank_job_to_dict)")
    args = parser.parse_args(argv)
    job = rank_job_from_dict(json.loads(args.job.read_text()))
    result = run_rank(job)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
