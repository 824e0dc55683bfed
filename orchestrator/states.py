"""One table from each scheduler's job states to Faultdrill's, with an explicit UNKNOWN.

A job the scheduler no longer knows is UNKNOWN, never a success.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    SUSPENDED = "SUSPENDED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_success(self) -> bool:
        return self is JobState.COMPLETED


TERMINAL_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.OUT_OF_MEMORY,
    }
)
TERMINAL_STATE_NAMES = frozenset(state.value for state in TERMINAL_STATES)  # as the ledger records states

# Slurm: squeue %T and sacct State (sacct may append "by <uid>" to CANCELLED).
SLURM_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING,
    "COMPLETING": JobState.COMPLETING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.TIMEOUT,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
    "TIMEOUT": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL,
    "PREEMPTED": JobState.PREEMPTED,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
    "REQUEUED": JobState.REQUEUED,
    "SUSPENDED": JobState.SUSPENDED,
    "STOPPED": JobState.SUSPENDED,
}


def from_slurm(raw: str) -> JobState:
    """Map a Slurm state word (``CANCELLED by 0``, ``RUNNING``, ...) to a JobState."""
    word = raw.strip().split(" ")[0].rstrip("+").upper()
    return SLURM_STATES.get(word, JobState.UNKNOWN)


# PBS: the job_state letter of ``qstat -f`` (Torque and PBS Pro/OpenPBS, and Slurm's Torque wrappers).
# A finished letter (C, F, X) is a success only with an exit status of 0: Torque's C and PBS Pro's F
# carry ``exit_status``/``Exit_status``; without one (the Slurm-backed wrappers print none) the job
# is FAILED unless the caller has other evidence of its exit code.
def parse_sacct(stdout: str) -> dict[str, JobState]:
    """Lines of ``sacct -X -n -P -o JobID,State`` (allocation lines only)."""
    states: dict[str, JobState] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            states[parts[0]] = from_slurm(parts[1])
    return states


PBS_FINISHED_LETTERS = frozenset({"C", "F", "X"})
PBS_STATES: dict[str, JobState] = {
    "Q": JobState.PENDING,  # queued
    "W": JobState.PENDING,  # waiting for its start time or a dependency
    "H": JobState.PENDING,  # held (qhold, or a requeue hold): starts once released
    "T": JobState.PENDING,  # being moved to an execution host
    "R": JobState.RUNNING,
    "B": JobState.RUNNING,  # PBS Pro: an array that has begun (some subjobs ran)
    "E": JobState.COMPLETING,  # exiting after having run
    "S": JobState.SUSPENDED,
    "C": JobState.COMPLETED,  # Torque (and the wrappers: also Slurm's COMPLETING)
    "F": JobState.COMPLETED,  # PBS Pro, seen with qstat -x
    "X": JobState.COMPLETED,  # PBS Pro: a finished (expired) subjob of an array
    # M (PBS Pro: moved to another server) and U (PBS Pro: suspended for workstation activity; the
    # wrappers: a Slurm state they cannot name, such as OUT_OF_MEMORY) stay UNKNOWN.
}
# The exit status a PBS server gives a job it killed at a limit: PBS Pro's JOB_EXEC_KILL_*, Torque's
# JOB_EXEC_OVERLIMIT_* (the two sets do not overlap).
PBS_LIMIT_EXITS: dict[int, JobState] = {
    -29: JobState.TIMEOUT,  # PBS Pro: walltime
    -28: JobState.TIMEOUT,  # PBS Pro: cput
    -27: JobState.OUT_OF_MEMORY,  # PBS Pro: mem
    -26: JobState.OUT_OF_MEMORY,  # PBS Pro: vmem
    -10: JobState.OUT_OF_MEMORY,  # Torque: mem
    -11: JobState.TIMEOUT,  # Torque: walltime
    -12: JobState.TIMEOUT,  # Torque: cput
}


# PBS Pro and Torque: a job a signal N ended exits 256 + N (271: SIGTERM, what qdel sends, and what
# Torque's MOM sends at the walltime on many sites instead of its -11).
PBS_SIGNAL_BASE = 256


def pbs_signal(exit_status: int) -> int | None:
    """The signal that ended a PBS job, from its exit status (256 + N), if one did."""
    return exit_status - PBS_SIGNAL_BASE if PBS_SIGNAL_BASE < exit_status <= PBS_SIGNAL_BASE + 64 else None


def from_pbs(letter: str, exit_status: str | int | None = None, walltime_spent: bool = False) -> JobState:
    """Map a ``job_state`` letter (and, for finished jobs, the exit status) to a JobState.
    ``walltime_spent``: the job's record shows it used all of its walltime, so a signal's end
    (256 + N) was the walltime's (TIMEOUT), not a failure of its own."""
    state = PBS_STATES.get(letter.strip().upper()[:1], JobState.UNKNOWN)
    if state is not JobState.COMPLETED:
        return state
    try:
        code = int(str(exit_status).strip())
    except ValueError:
        return JobState.FAILED  # finished, but nothing shows it succeeded
    if code == 0:
        return JobState.COMPLETED
    if pbs_signal(code) is not None and walltime_spent:
        return JobState.TIMEOUT
    return PBS_LIMIT_EXITS.get(code, JobState.FAILED)
