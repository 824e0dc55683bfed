"""Verify that a process is one of the drill's own ranks before any fault touches it.

A target is accepted only when all of these hold: the rank wrote an identity file for this attempt;
that pid is alive with the same kernel start time (no pid reuse); it runs under our uid; its environment
carries the drill's run id and the expected job id and rank. Never match processes by name.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from experiments.layout import ENV_JOB_ID, ENV_RUN_ID, RankIdentity, RunPaths
from experiments.layout import ENV_WARM_WORLD as WARM_WORLD
from experiments.runtime.identity import start_ticks
from experiments.runtime.torchrun import RUN_ID_VAR as TORCHRUN_RUN_ID

# Which environment variables name the job and the rank, per launcher.
# FAULTDRILL_JOB_ID is the job as the controller names it (set by the batch script): an element
# of a PBS array under Slurm's wrappers (69[4]) has another Slurm id of its own.
JOB_ID_VARS = (ENV_JOB_ID, "SLURM_JOB_ID", "PBS_JOBID", "SUBMITIT_LOCAL_JOB_ID")
RANK_VARS = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SUBMITIT_LOCAL_GLOBALID")


class TargetRefused(RuntimeError):
    """The process could not be verified as the drill's own; nothing was signalled.

    ``gone``: the target no longer runs (it died, or its attempt ended): a fault that finds its
    target gone hit an attempt that was already ending, not a process it refused to touch.
    """

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class StepNotReached(TargetRefused):
    """An at_step fault's agent waited its time and the attempt had not reached the step: nothing
    was done; the controller starts it again closer to the step."""


@dataclass(frozen=True)
class VerifiedTarget:
    pid: int
    rank: int
    node: str
    job_id: str
    start_ticks: int | None = None  # the verified process's kernel start time
    pidfd: int | None = field(default=None, compare=False)  # a handle on that very process (Linux >= 5.3)
    group: bool = False  # it leads its own process group: signals go to the group (RankIdentity.group)
    identity_file: Path | None = None  # its registration, read again right before a signal (see check_not_left)


def signal_target(target: VerifiedTarget, number: int) -> None:
    """``number`` to the very process that was verified, however long ago: through its pidfd (a
    process that ended since is not signalled, whoever has its pid now), else after checking its
    start time again in the same instant. ProcessLookupError when it is gone.

    A rank that leads a process group of its own gets the signal with its whole group (the
    trainer a wrapper started), once the leader is shown to be the verified process and still the
    group's leader: a group's id is its leader's pid, never reused while the group has a member.

    A warm process that left the target's attempt since it was verified (it now serves the next
    generation) gets nothing, but a SIGCONT (a stopped process can have left nothing; continuing
    one is never a fault): TargetRefused, gone."""
    if number != signal.SIGCONT:
        check_not_left(target)
    if target.pidfd is not None:
        signal.pidfd_send_signal(target.pidfd, 0 if target.group else number)
    elif target.start_ticks is not None and start_ticks(target.pid) != target.start_ticks:
        raise ProcessLookupError(f"pid {target.pid} is no longer the process that was verified")
    elif not target.group:
        os.kill(target.pid, number)
        return
    if not target.group:
        return
    if os.getpgid(target.pid) != target.pid:  # it left its group (setsid): only it is the drill's to signal
        if target.pidfd is not None:
            signal.pidfd_send_signal(target.pidfd, number)
        else:
            os.kill(target.pid, number)
        return
    os.killpg(target.pid, number)


def check_not_left(target: VerifiedTarget) -> None:
    """TargetRefused (gone) when the target, a warm process, has left the attempt it was verified in."""
    if target.identity_file is None:
        return
    try:
        left_at = json.loads(target.identity_file.read_text()).get("left_at")
    except (OSError, ValueError, AttributeError):
        return  # the verification read it; a file being replaced is read next time
    if left_at is not None:
        raise TargetRefused(_left_why(target.rank, target.pid, left_at), gone=True)


def still_in_attempt(targets: list[VerifiedTarget]) -> list[VerifiedTarget]:
    """The targets that have not left their attempt since their verification; TargetRefused (gone)
    if none has (the first one's why)."""
    staying, left = [], []
    for target in targets:
        try:
            check_not_left(target)
        except TargetRefused as error:
            left.append(error)
            continue
        staying.append(target)
    if targets and not staying:
        raise left[0]
    return staying


def _left_why(rank: int, pid: int, left_at: float) -> str:
    return (f"rank {rank} (pid {pid}) left its attempt at {left_at:.3f} (its generation ended): the process "
            "serves the next one, the fault came too late")


def _pidfd(pid: int) -> int | None:
    """A handle on ``pid``'s process, taken before it is verified (so the checks that follow are of
    the process the handle holds); None where the kernel has none to give."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (OSError, AttributeError):
        return None


def read_identity(run_dir: Path, attempt: int, rank: int) -> RankIdentity:
    path = RunPaths(run_dir).rank_file(attempt, rank)
    try:
        return RankIdentity(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise TargetRefused(f"rank {rank} of attempt {attempt} has not registered ({path} missing)") from None
    except (json.JSONDecodeError, TypeError) as error:
        raise TargetRefused(f"identity file {path} is unreadable: {error}") from None


def verify_rank(run_dir: Path, run_id: str, attempt: int, rank: int, job_id: str) -> VerifiedTarget:
    identity = _registered(run_dir, attempt, rank, job_id)
    claim = _Claim(identity.pid, identity.start_ticks, rank, identity.group, f"rank {rank}")
    return _verify(run_dir, attempt, identity, claim, job_id, run_id)


def verify_launcher(run_dir: Path, run_id: str, attempt: int, rank: int, job_id: str) -> VerifiedTarget:
    """The launcher that started ``rank`` on its node (torchrun's agent), verified as a rank is: its
    pid and start time as the rank's registration gives them, its uid, the drill's run and job in
    its environment (not a rank: it starts several)."""
    identity = _registered(run_dir, attempt, rank, job_id)
    if identity.launcher_pid is None or identity.launcher_start_ticks is None:
        raise TargetRefused(f"rank {rank} is the process the scheduler's task started: it has no launcher of its "
                            "own on its node (process: launcher is for the workers of a torchrun)")
    claim = _Claim(identity.launcher_pid, identity.launcher_start_ticks, None, False, f"the launcher of rank {rank}")
    return _verify(run_dir, attempt, identity, claim, job_id, run_id)


@dataclass(frozen=True)
class _Claim:
    """The process a registration names: a rank (``rank`` checked in its environment) or its launcher."""

    pid: int
    start_ticks: int
    rank: int | None
    group: bool
    label: str


def _registered(run_dir: Path, attempt: int, rank: int, job_id: str) -> RankIdentity:
    identity = read_identity(run_dir, attempt, rank)
    if identity.left_at is not None:
        raise TargetRefused(_left_why(rank, identity.pid, identity.left_at), gone=True)
    if identity.job_id != job_id:
        raise TargetRefused(f"rank {rank} registered job {identity.job_id}, the drill's job is {job_id}")
    return identity


def _verify(run_dir: Path, attempt: int, identity: RankIdentity, claim: _Claim, job_id: str,
            run_id: str) -> VerifiedTarget:
    gone = TargetRefused(f"{claim.label} (pid {claim.pid}) is no longer running", gone=True)
    try:
        pidfd = _pidfd(claim.pid)
    except ProcessLookupError:
        raise gone from None
    try:
        ticks = _verified(claim, job_id, run_id, gone, identity)
    except BaseException:
        if pidfd is not None:
            os.close(pidfd)
        raise
    return VerifiedTarget(pid=claim.pid, rank=identity.rank, node=identity.node, job_id=job_id, start_ticks=ticks,
                          pidfd=pidfd, group=claim.group, identity_file=RunPaths(run_dir).rank_file(attempt, identity.rank))


def _verified(claim: _Claim, job_id: str, run_id: str, gone: TargetRefused, identity: RankIdentity) -> int:
    """The claimed process's start ticks, once it is shown to be the drill's own."""
    ticks = start_ticks(claim.pid)
    if ticks is None:
        raise gone
    if ticks != claim.start_ticks:
        raise TargetRefused(f"pid {claim.pid} was reused by another process (start time differs)")
    try:
        process = psutil.Process(claim.pid)
        with process.oneshot():
            uid = process.uids().real
            environ = process.environ()
    except psutil.NoSuchProcess:
        raise gone from None
    except psutil.AccessDenied:
        if not claim.group or identity.supervisor_pid is None:
            raise TargetRefused(f"pid {claim.pid}: cannot read its environment, refusing to act") from None
        _verified_by_supervisor(claim, identity, job_id, run_id, gone)
        return ticks
    if uid != os.getuid():
        raise TargetRefused(f"pid {claim.pid} belongs to uid {uid}, not to the drill's uid {os.getuid()}")
    if not environ:
        # A rank always has the drill's variables: an empty environment is a process whose memory
        # the kernel already released (it is exiting, e.g. its launcher ended it a moment ago).
        raise gone
    _check_environment(environ, run_id, job_id, claim.rank, claim.pid)
    return ticks


def _verified_by_supervisor(claim: _Claim, identity: RankIdentity, job_id: str, run_id: str,
                            gone: TargetRefused) -> None:
    """A rank whose environment cannot be read (a setuid container starter, apptainer's): shown the
    drill's as the child of the supervisor that registered it (its parent, still the very process:
    pid and start time), whose environment names the drill's run, job and rank, under our uid."""
    supervisor = identity.supervisor_pid
    assert supervisor is not None
    try:
        parent = psutil.Process(claim.pid).ppid()
        real = psutil.Process(claim.pid).uids().real
    except psutil.NoSuchProcess:
        raise gone from None
    if parent != supervisor or start_ticks(supervisor) != identity.supervisor_start_ticks:
        raise TargetRefused(f"pid {claim.pid}: its environment cannot be read and it is not the child of the "
                            f"supervisor that registered it (pid {supervisor}), refusing to act")
    if real != os.getuid():
        raise TargetRefused(f"pid {claim.pid} belongs to uid {real}, not to the drill's uid {os.getuid()}")
    try:
        environ = psutil.Process(supervisor).environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        raise TargetRefused(f"pid {claim.pid}: neither its environment nor its supervisor's (pid {supervisor}) can "
                            "be read, refusing to act") from None
    _check_environment(environ, run_id, job_id, claim.rank, supervisor)


def _check_environment(environ: dict[str, str], run_id: str, job_id: str, rank: int | None, pid: int) -> None:
    if environ.get(ENV_RUN_ID) != run_id:
        raise TargetRefused(f"pid {pid}: {ENV_RUN_ID}={environ.get(ENV_RUN_ID)!r}, expected {run_id!r}")
    job_ids = {environ[name] for name in JOB_ID_VARS if name in environ}
    if job_id not in job_ids:
        raise TargetRefused(f"pid {pid}: job id in its environment {sorted(job_ids)} is not {job_id}")
    if rank is None or WARM_WORLD in environ:
        return  # a warm job's process takes its rank from the coordinator's plan, not its environment:
        # its identity file (pid and start ticks, checked above) is the rank's word
    # A torchrun worker's RANK is its own; the scheduler's variables it inherited are its node's torchrun's.
    names = ("RANK",) if TORCHRUN_RUN_ID in environ else RANK_VARS
    ranks = {environ[name] for name in names if name in environ}
    if str(rank) not in ranks:
        raise TargetRefused(f"pid {pid}: rank in its environment {sorted(ranks)} is not {rank}")
