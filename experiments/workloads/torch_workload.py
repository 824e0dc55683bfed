"""PyTorch workload: the MLP or the CNN of ``synthetic``, trained with DDP over gloo.

Bitwise reproducibility across a restart rests on what is saved or derived here: the batch of a
step and its dropout masks are pure functions of (seed, step, rank); the optimizer state is
checkpointed with the weights (or, under the warm strategy, sent by a surviving peer).
"""

from __future__ import annotations

import io
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from experiments.layout import WorkloadSpec
from experiments.runtime import torch_state
from experiments.runtime.checkpoint import CheckpointMeta
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.sink import FileSink
from experiments.runtime.snapshot import ShareWriter
from experiments.workloads.base import Workload
from experiments.workloads.synthetic import (
    DROPOUT,
    DROPOUT_STREAM,
    IN_FEATURES,
    LEARNING_RATE,
    OUT_FEATURES,
    cnn_batch,
    mixed_seed,
    mlp_batch,
    model_size,
)


def build_mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Dropout(DROPOUT),
        nn.Linear(width, width), nn.ReLU(), nn.Dropout(DROPOUT),
        nn.Linear(width, OUT_FEATURES),
    )


def build_cnn(channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(channels, OUT_FEATURES),
    )


BUILDERS = {"mlp": build_mlp, "cnn": build_cnn}


class TorchWorkload(Workload):
    framework = "torch"
    determinism = ("torch.use_deterministic_algorithms(True); DDP(find_unused_parameters=True) so the "
                   "gradient buckets are never rebuilt; dropout masks seeded by (seed, rank, step)")

    def __init__(self) -> None:
        self.env: DistEnv | None = None
        self.spec = WorkloadSpec()
        self.model: nn.Module = nn.Identity()
        self.ddp: nn.Module = nn.Identity()
        self.optimizer: torch.optim.Optimizer | None = None
        self.width = 0
        self.staging = torch_state.StagingBuffers()  # the snapshot's host copies, reused
        # A second gloo group whose collectives may wait as long as a checkpoint takes (rank 0
        # writing or hashing one) where the default group gives up after the collective timeout.
        self.patient: Any = None

    @property
    def checkpoint_meta(self) -> CheckpointMeta:
        return CheckpointMeta("torch", torch_state.FORMAT, "all")

    def setup(self, env: DistEnv, spec: WorkloadSpec, timeouts: Timeouts) -> dict[str, float]:
        started = time.monotonic()
        self.join(env, timeouts)
        joined = time.monotonic()
        param_count = self.build(spec)
        self.wrap()
        return {"rendezvous_s": joined - started, "build_s": time.monotonic() - joined,
                "params": float(param_count), "hidden_width": float(self.width)}

    def build(self, spec: WorkloadSpec) -> int:
        """The model and its optimizer, as every rank builds them (no process group needed: a warm
        spare builds them before it has a rank). Returns the parameter count."""
        self.spec = spec
        _make_deterministic()
        self.width, param_count = model_size(spec.model, spec.params)
        torch.manual_seed(spec.seed)  # identical initial weights on every rank
        self.model = BUILDERS[spec.model](self.width)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE)
        return param_count

    def join(self, env: DistEnv, timeouts: Timeouts, host_store: bool = True) -> None:
        """This rank's place in the job's process group (and the patient group beside it);
        ``host_store``: rank 0 hosts the rendezvous store (not when the warm coordinator does)."""
        self.env = env
        _join_process_group(env, timeouts, host_store)
        self.patient = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeouts.checkpoint_s))

    def wrap(self) -> None:
        # DDP rebuilds its gradient buckets after the first iteration of each process, so a resumed
        # process all-reduces its first step with another bucket layout than the run it continues;
        # with more than 2 ranks the ring's summation order changes and the weights drift by an ulp
        # (measured: 4 ranks on 2 nodes diverged at the first step after the resume). With
        # find_unused_parameters the reducer never rebuilds, so every step uses the same layout.
        self.ddp = DistributedDataParallel(self.model, find_unused_parameters=True)

    def leave(self) -> None:
        """Out of a broken process group (a peer died): the model and optimizer stay as they are."""
        self.ddp = nn.Identity()
        if dist.is_initialized():
            dist.destroy_process_group()

    def share_state(self, source_rank: int, step: int) -> None:
        """Every rank takes ``source_rank``'s model and optimizer state after ``step``, broadcast
        over the group (a warm spare that takes a dead rank's place, a survivor a step behind)."""
        assert self.env is not None and self.optimizer is not None
        source = self.env.rank == source_rank
        payload = torch.empty(0, dtype=torch.uint8)
        if source:
            buffer = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step}, buffer)
            payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        dist.broadcast(size, src=source_rank)
        if not source:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(payload, src=source_rank)
        if source:
            return
        state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
        if state["step"] != step:
            raise ValueError(f"rank {source_rank} sent the state of step {state['step']}, not {step}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.env is not None
        make = mlp_batch if self.spec.model == "mlp" else cnn_batch
        inputs, targets = make(self.spec.seed, step, self.env.rank, self.spec.batch_size)
        if self.spec.model == "cnn":
            inputs = inputs.transpose(0, 3, 1, 2)  # channels-last (shared data) -> channels-first
        return torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(targets)

    def train_step(self, step: int) -> float:
        assert self.optimizer is not None and self.env is not None
        # The dropout masks of a step are a pure function of (seed, rank, step), like its batch:
        # whoever trains a rank's step draws the same ones (a restart, a warm spare in its place).
        _seed_dropout(mixed_seed(self.spec.seed, DROPOUT_STREAM, self.env.rank, step))
        inputs, targets = self.batch(step)
        self.ddp.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.ddp(inputs), targets)
        loss.backward()  # DDP all-reduces gradients here: a dead peer raises in this call
        self.optimizer.step()
        return float(loss.item())

    def snapshot(self, sink: FileSink, step: int) -> ShareWriter:
        assert self.env is not None and self.optimizer is not None
        return torch_state.snapshot(sink, self.model, self.optimizer, rank=self.env.rank, step=step,
                                    extra={"hidden_width": self.width}, staging=self.staging)

    def save(self, sink: FileSink, step: int) -> None:
        """Written from the tensors themselves: training waits for this save, so nothing is copied."""
        assert self.env is not None and self.optimizer is not None
        torch_state.save(sink, self.model, self.optimizer, rank=self.env.rank, step=step,
                         extra={"hidden_width": self.width})

    def load(self, directory: Path, step: int) -> None:
        assert self.env is not None and self.optimizer is not None
        state = torch_state.load_file(directory / torch_state.MODEL_FILE)
        if state["step"] != step or state["hidden_width"] != self.width:
            raise ValueError(f"{directory / torch_state.MODEL_FILE} holds step {state['step']}, width "
                             f"{state['hidden_width']}; expected step {step}, width {self.width}")
        torch_state.load(directory, self.model, self.optimizer, rank=self.env.rank, step=step)

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        return [(name, tensor.detach().cpu().numpy()) for name, tensor in self.model.state_dict().items()]

    def barrier(self, timeout_s: float | None = None) -> None:
        """``timeout_s`` given: a wait as long as a checkpoint may take (the patient group, whose
        timeout is the checkpoint timeout). gloo's own timeouts count even for monitored_barrier's
        sends (measured: a rank in monitored_barrier(timeout=300 s) failed after the 1 s collective
        timeout while rank 0 hashed a checkpoint), and a dead peer still fails it at once (its
        sockets close), which a wait on the rendezvous store would not notice."""
        dist.barrier(group=self.patient if timeout_s is not None else None)

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=self.patient if timeout_s is not None else None)
        return int(tensor.item())

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _seed_dropout(seed: int) -> None:
    """``torch.manual_seed`` for the generators a step draws from, at a step's cost: the CPU's, and
    CUDA's once it is in use (``manual_seed`` on a CPU-only run queues a lazy CUDA seeding that
    formats a stack trace, ~10% of a small model's step)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def _make_deterministic() -> None:
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (a second workload in one process, as in tests): it stays 1
    torch.use_deterministic_algorithms(True)


def _join_process_group(env: DistEnv, timeouts: Timeouts, host_store: bool = True) -> None:
    """Rendezvous at tcp://master_addr:master_port, with a long wait for late ranks (the store)
    and a short one for collectives (how quickly a rank gives up on a peer that died)."""
    if env.scheduler in ("local", "single"):
        # Every rank is on this host: talk over loopback rather than whatever the host name
        # resolves to (gloo warns and guesses otherwise).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore(
        env.master_addr, env.master_port, env.world_size, is_master=host_store and env.rank == 0,
        timeout=timedelta(seconds=timeouts.rendezvous_s), wait_for_workers=True,
    )
    dist.init_process_group(
        "gloo", store=store, rank=env.rank, world_size=env.world_size,
        timeout=timedelta(seconds=timeouts.collective_s),
    )
