"""One table from what is known of a failed attempt to its failure class.

What is known: the scheduler's state, the batch script's step exit code, the ranks' own error
records, how the controller noticed (a step exit, the scheduler, heartbeats' silence, a start that
never came) and whether the ranks got the scheduler's warning first. The rules are tried in order;
the first that holds names the class, with the evidence that made it. The restart policy
(``restart.policy``) maps each class to an action.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from experiments.layout import NCCL_PEER_LOSS_MARKERS, SIGNAL_EXIT_BASE
from orchestrator.states import JobState

# What a rank's error says when the checkpoint filesystem was full (experiments/runtime/checkpoint).
CHECKPOINT_WRITE_MARKERS = ("could not be written: no space left on device", "[Errno 28]", "[Errno 122]")
OUT_OF_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory")
# What a survivor says when a peer vanished: a consequence, not the cause.
PEER_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
                     "Socket Timeout", "Timed out waiting", "UnavailableError", "peer", "MPI_ABORT",
                     *NCCL_PEER_LOSS_MARKERS)


class FailureClass(str, Enum):
    NODE_FAIL = "NODE_FAIL"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    CANCELLED = "CANCELLED"  # by a person (or a tool) outside the drill
    RANK_EXIT = "RANK_EXIT"
    RANK_SIGNAL = "RANK_SIGNAL"
    HANG = "HANG"
    START_TIMEOUT = "START_TIMEOUT"
    CHECKPOINT_WRITE_FAILED = "CHECKPOINT_WRITE_FAILED"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class DrillEnded:
    """The drill itself ended the job the attempt ran in, after an earlier failure (its class)."""

    failure_class: str
    why: str


@dataclass(frozen=True)
class FailureEvidence:
    state: JobState  # the scheduler's, when the failure was taken (may still be RUNNING)
    noticed_by: str  # step_exit | scheduler_end | poll | last_heartbeat | job_running | requeued
    exit_code: int | None = None  # the rank launch's, from the batch script's step_exit
    rank_errors: tuple[str, ...] = ()  # what ranks died of, earliest first
    warned: bool = False  # the ranks got the scheduler's warning (and checkpointed) first
    lost_nodes: tuple[str, ...] = ()  # nodes the injector's record says were broken (node-crash, partition)
    oom_killed: tuple[str, ...] = ()  # ranks the injector's record says the kernel's OOM killer ended (oom-rank)
    # Steps of the job the scheduler says ran out of memory (Slurm's task/cgroup: the rank step is
    # OUT_OF_MEMORY while the job itself is FAILED, its batch script having gone on)
    oom_steps: tuple[str, ...] = ()
    ended_by_drill: DrillEnded | None = None  # the drill cancelled the job (not a person)
    signalled: str | None = None  # the signal the injector's record says it sent a rank of the attempt
    # The attempt failed at its job's walltime (its start plus its time limit, on the job's clock)
    # or later: a walltime, even before the scheduler says TIMEOUT.
    walltime_reached: bool = False


@dataclass(frozen=True)
class Classified:
    failure_class: FailureClass
    evidence: str  # the fact that decided it, in words

    def __str__(self) -> str:
        return f"{self.failure_class.value} ({self.evidence})"


def classify(known: FailureEvidence) -> Classified:
    for rule in _RULES:
        if (found := rule(known)) is not None:
            return found
    return Classified(FailureClass.UNKNOWN, f"scheduler state {known.state.value}, noticed by {known.noticed_by}")


def _silence(known: FailureEvidence) -> Classified | None:
    if known.noticed_by == "last_heartbeat":
        return Classified(FailureClass.HANG, "a rank fell silent past its allowance")
    if known.noticed_by == "job_running":
        return Classified(FailureClass.START_TIMEOUT, "the job ran but no training step came")
    return None


def _scheduler(known: FailureEvidence) -> Classified | None:
    state = known.state
    if state is JobState.NODE_FAIL:
        return Classified(FailureClass.NODE_FAIL, "the scheduler: NODE_FAIL")
    if state is JobState.TIMEOUT:
        return Classified(FailureClass.TIMEOUT, "the scheduler: TIMEOUT (walltime)")
    if state is JobState.PREEMPTED:
        return Classified(FailureClass.PREEMPTED, "the scheduler: PREEMPTED")
    if state is JobState.OUT_OF_MEMORY:
        return Classified(FailureClass.OUT_OF_MEMORY, "the scheduler: OUT_OF_MEMORY")
    if known.oom_steps:
        return Classified(FailureClass.OUT_OF_MEMORY, f"the scheduler: step {', '.join(known.oom_steps)} OUT_OF_MEMORY")
    if state is JobState.REQUEUED or known.noticed_by == "requeued":
        return Classified(FailureClass.PREEMPTED, "the scheduler requeued the running job")
    return None


def _node_lost(known: FailureEvidence) -> Classified | None:
    """The injector broke a node of the job: known at once, long before Slurm notices (SlurmdTimeout)."""
    if known.lost_nodes:
        how = ("its ranks fell silent and it did not answer the node check" if known.noticed_by == "node_check"
               else "the injector's record")
        return Classified(FailureClass.NODE_FAIL, f"node {', '.join(known.lost_nodes)} lost ({how})")
    return None


def _oom_killed(known: FailureEvidence) -> Classified | None:
    """The agent read the OOM kill in the rank's memory cgroup (the scheduler here has no task/cgroup
    to say OUT_OF_MEMORY itself): a SIGKILL from the kernel, not a person or a peer."""
    if known.oom_killed:
        return Classified(FailureClass.OUT_OF_MEMORY, f"the kernel's OOM killer ended {', '.join(known.oom_killed)} "
                                                      "(the injector's record of its memory cgroup)")
    return None


def _at_walltime(known: FailureEvidence) -> Classified | None:
    """The job ended when its walltime was up: the scheduler's TIMEOUT, which it may not have
    reported yet when the rank launch's exit is seen (PBS under load: seen first)."""
    if known.walltime_reached:
        return Classified(FailureClass.TIMEOUT, "ended at the job's walltime (its start plus its time limit)")
    return None


def _warned(known: FailureEvidence) -> Classified | None:
    """The warning came first, then the job ended: a preemption (or a walltime the scheduler has
    not reported yet, which the policy treats alike)."""
    if known.warned:
        return Classified(FailureClass.PREEMPTED, f"the scheduler's warning, then {known.state.value.lower()}")
    return None


# What PyTorch's NCCL abort adds before the failure that caused it (which may be the rank's own).
ORIGINAL_REASON = "Original reason for failure was:"


def is_peer_loss(error: str) -> bool:
    """A survivor's word that a peer vanished: a consequence, not a cause. An abort that names its
    original reason is judged by that reason."""
    if ORIGINAL_REASON in error:
        return is_peer_loss(error.split(ORIGINAL_REASON, 1)[1])
    return any(marker in error for marker in PEER_LOSS_MARKERS)


def own_errors(known: FailureEvidence) -> tuple[str, ...]:
    """The ranks' errors that are causes: not a survivor's word that a peer vanished."""
    return tuple(error for error in known.rank_errors if not is_peer_loss(error))


def _rank_errors(known: FailureEvidence) -> Classified | None:
    for error in own_errors(known):
        if any(marker in error for marker in CHECKPOINT_WRITE_MARKERS):
            return Classified(FailureClass.CHECKPOINT_WRITE_FAILED, error)
        if any(marker in error for marker in OUT_OF_MEMORY_MARKERS):
            return Classified(FailureClass.OUT_OF_MEMORY, error)
    return None


def _cancelled(known: FailureEvidence) -> Classified | None:
    if known.state is JobState.CANCELLED and known.ended_by_drill is not None:
        # The drill ended the allocation: the failure that led to it is the cause, not a person.
        return Classified(FailureClass(known.ended_by_drill.failure_class),
                          f"the drill ended the job: {known.ended_by_drill.why}")
    if known.state is JobState.CANCELLED:
        return Classified(FailureClass.CANCELLED, "cancelled outside the drill")
    return None


def _exit(known: FailureEvidence) -> Classified | None:
    if causes := own_errors(known):
        return Classified(FailureClass.RANK_EXIT, f"a rank raised: {causes[0]}")
    code = known.exit_code
    if (code is None or code == 0) and known.rank_errors:
        return Classified(FailureClass.RANK_SIGNAL, "a rank died without a word (its peers lost it: "
                                                    f"{known.rank_errors[0][:200]})")
    if code is None or code == 0:
        return None
    if code > SIGNAL_EXIT_BASE:
        return Classified(FailureClass.RANK_SIGNAL, f"{_signal_name(code - SIGNAL_EXIT_BASE)} (exit code {code})")
    if code < 0:  # a process killed by a signal, as Python's subprocess reports it
        return Classified(FailureClass.RANK_SIGNAL, f"{_signal_name(-code)} (exit code {code})")
    if known.signalled in LETHAL_SIGNALS:  # a survivor's exit came first (Open MPI 5 aborts its world at once)
        return Classified(FailureClass.RANK_SIGNAL, f"{known.signalled} (the injector's record; the launch then "
                                                    f"exited with code {code}, a survivor's)")
    return Classified(FailureClass.RANK_EXIT, f"exit code {code}")


# The signals whose default action ends a process (a script with no handler for SIGUSR1 dies of it);
# not SIGSTOP/SIGCONT (a pause) or the others a process ignores by default.
LETHAL_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGHUP", "SIGSEGV", "SIGBUS",
                            "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE"})


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signalled(known: FailureEvidence) -> Classified | None:
    """No exit code to read (a warm job's coordinator on Slurm sees a connection end, not how the
    process ended): the signal the injector sent is the evidence."""
    if known.exit_code is None and known.signalled in LETHAL_SIGNALS:
        return Classified(FailureClass.RANK_SIGNAL, f"{known.signalled} (the injector's record)")
    return None


_RULES = (_node_lost, _oom_killed, _silence, _scheduler, _at_walltime, _rank_errors, _warned, _cancelled, _exit,
          _signalled)
