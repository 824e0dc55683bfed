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
