"""The scheduler's warning before it ends a job (walltime near, preemption): checkpoint, then wait.

Slurm sends the warning signal (the batch script's ``--signal=USR2@N``) to every rank when the
walltime is N seconds away, and the ``preempt`` fault sends it before it cancels a job, as sites
do. A rank that gets it does not die (submitit's own handler would end rank 0 with an error): it
notes the time, and the runner checks the note at agreed steps. Ranks must take a checkpoint at
the same step, so rank 0's note decides, broadcast every ``WARNING_POLL_STEPS`` steps (a rank of
a one-rank job checks every step). After that checkpoint is durable the ranks train no more and
wait for the scheduler to end the job (TIMEOUT, PREEMPTED, CANCELLED): nothing is lost, and the
job ends as the scheduler says. A warning that is never followed by the end (someone sent the
signal by hand) ends the wait after ``hold_s`` with ``EXIT_WARNED``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Mapping

from experiments.layout import ENV_WARNING_HOLD_S, ENV_WARNING_SIGNAL

DEFAULT_WARNING_SIGNAL = "SIGUSR2"
DEFAULT_HOLD_S = 300.0
WARNING_POLL_STEPS = 10
EXIT_WARNED = 75  # EX_TEMPFAIL: checkpointed on the scheduler's warning, go on in a new job


def warning_signal(environ: dict[str, str] | os._Environ[str] | None = None) -> signal.Signals:
    env = os.environ if environ is None else environ
    name = env.get(ENV_WARNING_SIGNAL) or DEFAULT_WARNING_SIGNAL
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"{ENV_WARNING_SIGNAL}={name!r} is not a signal name (e.g. SIGUSR2, SIGTERM)") from None


@dataclass
class WarningNote:
    """When the warning arrived on this rank (None: not yet)."""

    signal: signal.Signals
    received_at: float | None = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.time()

    def install(self) -> "WarningNote":
        signal.signal(self.signal, self._note)
        return self

    @property
    def received(self) -> bool:
        return self.received_at is not None


def hold_seconds(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(ENV_WARNING_HOLD_S)
    return float(raw) if raw else DEFAULT_HOLD_S


def wait_for_the_end(hold_s: float) -> None:
    """Sleep until the scheduler ends the job (a signal that kills), at most ``hold_s``."""
    deadline = time.monotonic() + hold_s
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
