"""A small NumPy workload for tests of the real runner: its write takes ``write_s`` (a large model's
does, on slow storage) and can fail at one step as a full disk would."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.layout import WorkloadSpec
from experiments.runtime.checkpoint import CheckpointMeta
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.sink import FileSink
from experiments.runtime.snapshot import ShareWriter
from experiments.workloads.base import Workload


class NumpyWorkload(Workload):
    framework = "numpy"

    def __init__(self, write_s: float, fail_at: int | None = None) -> None:
        self.weights = np.zeros(4)
        self.write_s, self.fail_at = write_s, fail_at
        self.writing_step: int | None = None  # the checkpoint whose write is under way, if any
        self.steps_during_write: dict[int, int] = {}  # checkpoint step -> training steps run during its write

    @property
    def checkpoint_meta(self) -> CheckpointMeta:
        return CheckpointMeta("numpy", "raw float64", "all")

    def setup(self, env: DistEnv, spec: WorkloadSpec, timeouts: Timeouts) -> dict[str, float]:
        return {}

    def train_step(self, step: int) -> float:
        self.weights += step  # the model changes while an earlier checkpoint may still be written
        writing = self.writing_step
        if writing is not None:
            self.steps_during_write[writing] = self.steps_during_write.get(writing, 0) + 1
        time.sleep(0.01)
        return float(self.weights.sum())

    def snapshot(self, sink: FileSink, step: int) -> ShareWriter:
        weights = self.weights.copy()

        def write() -> None:
            self.writing_step = step
            time.sleep(self.write_s)
            self.writing_step = None
            if step == self.fail_at:
                raise OSError(28, "No space left on device")
            sink.write_bytes("weights.bin", weights.tobytes())

        return write

    def load(self, directory: Path, step: int) -> None:
        self.weights = np.frombuffer((directory / "weights.bin").read_bytes()).copy()

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        return [("w", self.weights)]

    def barrier(self, timeout_s: float | None = None) -> None:
        pass

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        return value

    def shutdown(self) -> None:
        pass
