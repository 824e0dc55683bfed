"""The contract between the framework-agnostic runner and one deep-learning framework.

The runner owns everything a drill measures (resume, checkpoint cadence, heartbeats, events, the
final digest file); a workload owns only what needs its framework. Adding a framework is one
module implementing ``Workload`` plus one line in ``experiments.workloads.REGISTRY``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from experiments.layout import WorkloadSpec
from experiments.runtime.checkpoint import CheckpointMeta
from experiments.runtime.digest import digest_arrays  # noqa: F401  (the built-in workloads' digest, one place)
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.sink import FileSink
from experiments.runtime.snapshot import ShareWriter
from experiments.runtime.state_gate import StateGate

StateArrays = dict[str, np.ndarray]


class Workload(ABC):
    """One rank's training in one framework. Steps are 1-based: step S is the S-th update."""

    framework: str = ""
    # The switches this workload turns on so that a resumed run is bitwise the uninterrupted one
    # (reported by the determinism study); empty if it needs none.
    determinism: str = ""
    gate: StateGate  # where each step's local update runs (serve_state): set by the workload

    @property
    @abstractmethod
    def checkpoint_meta(self) -> CheckpointMeta:
        """Framework, file format and writers, recorded in every manifest."""

    @abstractmethod
    def setup(self, env: DistEnv, spec: WorkloadSpec, timeouts: Timeouts) -> dict[str, float]:
        """Join the process group, build model and optimizer in their cold-start state.

        Returns named phase durations in seconds (e.g. ``rendezvous_s``) for the
        ``framework_ready`` event. Must fail (raise) rather than wait forever for a peer.
        """

    def warm_up(self) -> None:  # noqa: B027 (an optional hook: a no-op unless a framework overrides it)
        """Pay now what the first step after a set-up costs beyond a step (a warm spare set calls it
        while it waits), leaving the state exactly as set-up left it. Nothing, unless a framework
        has such a cost."""

    @abstractmethod
    def train_step(self, step: int) -> float:
        """One update on the batch of global step ``step`` (a pure function of seed, step and
        rank, so the data order survives a restart); returns this rank's loss."""

    def paced_step(self, step: int, least_s: float) -> float:
        """``train_step``, then what is left of ``least_s`` waited out (workload.step_s: a small
        model standing in for one whose steps take that long)."""
        started = time.monotonic()
        loss = self.train_step(step)
        if (left := least_s - (time.monotonic() - started)) > 0:
            time.sleep(left)
        return loss

    def serve_state(self) -> bool:
        """Before ``setup``: make this rank's state servable to a warm spare set (each step's local
        update inside ``gate``, apart from its all-reduce; ``peer_state``, ``take_peer_state``).
        False where the framework cannot."""
        return False

    def peer_state(self) -> StateArrays:
        """The whole state after ``gate.completed`` as named arrays (weights, optimizer, counters),
        the same on every rank (a data-parallel replica): a spare set's ranks take it instead of a
        checkpoint. Called with the gate held."""
        raise NotImplementedError(f"{self.framework}: no state to serve to a warm spare set")

    def take_peer_state(self, arrays: StateArrays, step: int) -> None:
        """Make ``peer_state``'s arrays (a survivor's, after ``step``) this rank's state."""
        raise NotImplementedError(f"{self.framework}: cannot take a survivor's state")

    @abstractmethod
    def snapshot(self, sink: FileSink, step: int) -> ShareWriter:
        """Capture this rank's share of the state after ``step`` (weights, optimizer, this rank's
        RNG states, the data position) as a copy, and return what writes it through ``sink``
        (possibly on another thread, while training changes the model). Every rank is called."""

    def save(self, sink: FileSink, step: int) -> None:
        """``snapshot`` and write, in a row (a synchronous checkpoint)."""
        self.snapshot(sink, step)()

    @abstractmethod
    def load(self, directory: Path, step: int) -> None:
        """Restore the state ``save`` wrote into the (verified) checkpoint ``directory``."""

    @abstractmethod
    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        """The model's weights as (name, array) pairs: the digest and the determinism study's
        weight comparison both read them."""

    def digest(self) -> str:
        """sha256 over the model weights in a canonical order (see ``digest_arrays``)."""
        return digest_arrays(self.named_weights())

    @abstractmethod
    def barrier(self, timeout_s: float | None = None) -> None:
        """Wait for every rank; ``timeout_s`` None means the collective timeout from setup."""

    @abstractmethod
    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        """Rank 0's ``value`` on every rank (the runner agrees on the resume step this way).

        ``timeout_s``: how long the others may wait for rank 0 to get there (it may be hashing a
        large checkpoint); None means the collective timeout from setup.
        """

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the process group after a successful run."""


