"""Chainer workload: the MLP or the CNN of ``synthetic``, data-parallel over ChainerMN (MPI).

Ranks come from an MPI launcher (``mpiexec`` locally, ``srun --mpi=pmix`` on Slurm) and must be
started with ``SETUPTOOLS_USE_DISTUTILS=stdlib``: Chainer imports numpy.distutils, which needs the
standard library's distutils, and the choice is made when the interpreter starts.

Bitwise reproducibility across a restart rests on: the batch of a step is a pure function of
(seed, step, rank); so are the dropout masks (a generator seeded from them at each step: no rank
holds state another cannot rebuild, so any survivor's state is the whole run's, see
experiments/warm/state_channel.py); the Adam state (moments and step counts) is checkpointed with
the weights; and the multi-node optimizer is primed in ``setup`` (see ``_prime``) so that every
``update`` is a real update. A step's all-reduce and its Adam update are two calls: the update runs
inside the workload's ``StateGate``.
"""

from __future__ import annotations

import atexit
import functools
import io
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np

with warnings.catch_warnings():
    # Chainer 7.8.1 imports pkg_resources, which setuptools deprecates: a notice per rank per start.
    warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
    import chainer
import chainer.functions as F
import chainer.links as L
import chainermn
from chainer import initializers, serializers
from chainer.serializers.npz import NpzDeserializer

from experiments.layout import WorkloadSpec
from experiments.runtime.checkpoint import CheckpointMeta
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.sink import FileSink
from experiments.runtime.snapshot import ShareWriter
from experiments.runtime.state_gate import StateGate
from experiments.workloads.base import StateArrays, Workload
from experiments.workloads.npz_writer import write_npz
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

MODEL_FILE = "model.npz"
# Not one of synthetic's streams: initial weights are a framework's own business.
INIT_STREAM = 3
BARRIER_POLL_S = 0.0005

MaskSource = Callable[[tuple[int, ...]], np.ndarray]


class MLP(chainer.Chain):
    """IN_FEATURES -> h -> h -> OUT_FEATURES, ReLU, dropout after each hidden layer."""

    def __init__(self, width: int, init_rng: np.random.RandomState) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(IN_FEATURES, width, initialW=initializers.LeCunNormal(rng=init_rng))
            self.l2 = L.Linear(width, width, initialW=initializers.LeCunNormal(rng=init_rng))
            self.l3 = L.Linear(width, OUT_FEATURES, initialW=initializers.LeCunNormal(rng=init_rng))
        self.masks: MaskSource | None = None  # None: no dropout (evaluation)

    def forward(self, x: Any) -> chainer.Variable:
        h = self._dropout(F.relu(self.l1(x)))
        h = self._dropout(F.relu(self.l2(h)))
        return self.l3(h)

    def _dropout(self, h: chainer.Variable) -> chainer.Variable:
        if self.masks is None or not chainer.config.train:
            return h
        # An explicit mask: F.dropout would otherwise draw from NumPy's global generator.
        return F.dropout(h, DROPOUT, mask=self.masks(h.shape))


class CNN(chainer.Chain):
    """conv3x3(1->c) -> ReLU -> conv3x3(c->c) -> ReLU -> global average pool -> dense; NCHW."""

    def __init__(self, channels: int, init_rng: np.random.RandomState) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(1, channels, 3, pad=1,
                                         initialW=initializers.LeCunNormal(rng=init_rng))
            self.conv2 = L.Convolution2D(channels, channels, 3, pad=1,
                                         initialW=initializers.LeCunNormal(rng=init_rng))
            self.fc = L.Linear(channels, OUT_FEATURES, initialW=initializers.LeCunNormal(rng=init_rng))
        self.masks: MaskSource | None = None  # unused: the CNN has no dropout

    def forward(self, x: Any) -> chainer.Variable:
        h = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc(F.mean(h, axis=(2, 3)))


def build_model(model: str, size: int, seed: int) -> MLP | CNN:
    """The model in its cold-start state: the same weights for the same (model, size, seed)."""
    init_rng = np.random.RandomState(np.random.MT19937(mixed_seed(seed, INIT_STREAM)))
    if model == "mlp":
        return MLP(size, init_rng)
    if model == "cnn":
        return CNN(size, init_rng)
    raise ValueError(f"unknown model {model!r}")


def param_count(link: chainer.Link) -> int:
    return sum(param.size for param in link.params())


def dropout_rng(seed: int, rank: int, step: int) -> np.random.RandomState:
    """The masks of ``step`` on ``rank``: a pure function of the three (MT19937, as NumPy's legacy
    dropout draws)."""
    return np.random.RandomState(np.random.MT19937(mixed_seed(seed, DROPOUT_STREAM, rank, step)))


class ChainerWorkload(Workload):
    framework = "chainer"
    determinism = ("chainermn multi-node optimizer primed at setup (weights broadcast, parameter set "
                   "recorded) so a restarted process's first update is a real Adam step; dropout masks "
                   "from an MT19937 seeded by (seed, rank, step); Adam's t, m and v checkpointed with "
                   "the weights; gradients in one MPI_Allreduce of fixed size")

    def __init__(self) -> None:
        self.env: DistEnv | None = None
        self.spec = WorkloadSpec()
        self.timeouts = Timeouts()
        self.comm: Any = None  # chainermn communicator
        self.model: MLP | CNN | None = None
        self.optimizer: Any = None  # chainermn multi-node optimizer around Adam
        self.rng = np.random.RandomState(0)  # this step's dropout masks (dropout_rng)
        self.gate = StateGate()
        self.width = 0
        self.shut_down = False
        self.staging: dict[str, np.ndarray] = {}  # the snapshot's copies, reused (see _npz_arrays)

    @property
    def checkpoint_meta(self) -> CheckpointMeta:
        file_format = f"chainer save_npz (NumPy .npz, uncompressed), chainer {chainer.__version__}"
        return CheckpointMeta("chainer", file_format, "rank0")

    def setup(self, env: DistEnv, spec: WorkloadSpec, timeouts: Timeouts) -> dict[str, float]:
        self.env, self.spec, self.timeouts = env, spec, timeouts
        started = time.monotonic()
        self.comm = _join(env)
        atexit.register(self._abort_unless_shut_down)
        joined = time.monotonic()
        self.width, count = model_size(spec.model, spec.params)
        self.model = build_model(spec.model, self.width, spec.seed)
        self.model.masks = self._mask
        adam = chainer.optimizers.Adam(alpha=LEARNING_RATE)
        self.optimizer = chainermn.create_multi_node_optimizer(adam, self.comm)
        self.optimizer.setup(self.model)
        _prime(self.optimizer, self.model, self.comm)
        return {"rendezvous_s": joined - started, "build_s": time.monotonic() - joined,
                "params": float(count), "hidden_width": float(self.width)}

    def _mask(self, shape: tuple[int, ...]) -> np.ndarray:
        # What F.dropout computes from numpy.random.rand, from this rank's own generator.
        keep = self.rng.random_sample(shape) >= DROPOUT
        return np.float32(1.0 / (1.0 - DROPOUT)) * keep

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.env is not None
        if self.spec.model == "mlp":
            return mlp_batch(self.spec.seed, step, self.env.rank, self.spec.batch_size)
        images, targets = cnn_batch(self.spec.seed, step, self.env.rank, self.spec.batch_size)
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2)), targets  # NHWC -> NCHW

    def train_step(self, step: int) -> float:
        assert self.model is not None and self.optimizer is not None and self.env is not None
        inputs, targets = self.batch(step)
        self.rng = dropout_rng(self.spec.seed, self.env.rank, step)
        with chainer.using_config("train", True):
            loss = F.mean_squared_error(self.model(inputs), targets)
        self.model.cleargrads()
        loss.backward()
        # What the multi-node optimizer's update does, in two: the gradients all-reduced (mean over
        # ranks, like DDP; MPI has no timeout: a dead peer leaves this call blocked until the
        # launcher ends the job), then Adam's update, inside the gate (nothing of a peer's).
        if self.optimizer.is_changed(self.model):
            raise RuntimeError("chainer: the model's parameters changed after setup")
        self.comm.multi_node_mean_grad(self.model, self.optimizer.zero_fill)
        with self.gate.updating(step):
            self.optimizer.actual_optimizer.update()
        return float(loss.array)

    def snapshot(self, sink: FileSink, step: int) -> ShareWriter:
        """What ``serializers.save_npz(handle, obj, compression=False)`` writes (an uncompressed .npz of
        the serialized arrays), with the arrays copied first (into buffers kept from one snapshot to
        the next) so that the write may come later. Uncompressed:
        save_npz's default (zip deflate) took 14-19x as long for 9 % fewer bytes (measured: 1M and
        10M-parameter MLP with Adam state, save + fsync)."""
        assert self.env is not None
        if self.env.rank != 0:
            return lambda: None
        arrays = _npz_arrays(_TrainingState(self, step), self.staging)

        def write() -> None:
            with sink.open(MODEL_FILE) as handle:
                write_npz(handle, arrays)

        return write

    def load(self, directory: Path, step: int) -> None:
        assert self.env is not None
        with _open_npz(directory / MODEL_FILE) as npz:
            saved_step, saved_width = int(npz["step"]), int(npz["hidden_width"])
            if saved_step != step or saved_width != self.width:
                raise ValueError(f"{directory / MODEL_FILE} holds step {saved_step}, width {saved_width}; "
                                 f"expected step {step}, width {self.width}")
            NpzDeserializer(npz).load(_TrainingState(self, step))
        self.gate.resumed(step)

    def serve_state(self) -> bool:
        return True  # every step is split so (what ChainerMN's update does, in two calls)

    def peer_state(self) -> StateArrays:
        return _npz_arrays(_TrainingState(self, self.gate.completed), {})

    def take_peer_state(self, arrays: StateArrays, step: int) -> None:
        held, width = int(arrays["step"]), int(arrays["hidden_width"])
        if held != step or width != self.width:
            raise ValueError(f"a survivor's state of step {held}, width {width}; expected step {step}, width {self.width}")
        NpzDeserializer(arrays).load(_TrainingState(self, step))
        self.gate.resumed(step)

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        assert self.model is not None
        return [(name, np.array(param.array)) for name, param in sorted(self.model.namedparams())]

    def barrier(self, timeout_s: float | None = None) -> None:
        # MPI collectives have no timeout. A non-blocking barrier polled against a deadline gives
        # this one a timeout; elsewhere (gradients, broadcast_int) a dead peer blocks the survivors
        # until the launcher (mpiexec, srun --kill-on-bad-exit) ends the job.
        limit = self.timeouts.collective_s if timeout_s is None else timeout_s
        request = self.comm.mpi_comm.Ibarrier()
        deadline = time.monotonic() + limit
        while not request.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(f"barrier: not every rank arrived within {limit:g} s")
            time.sleep(BARRIER_POLL_S)

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        # Bcast has no timeout (see barrier): meet at a barrier with one first, so that a rank 0
        # that never arrives ends the wait after timeout_s instead of never.
        self.barrier(timeout_s)
        buffer = np.array([value], dtype=np.int64)
        self.comm.mpi_comm.Bcast(buffer, root=0)
        return int(buffer[0])

    def shutdown(self) -> None:
        # mpi4py calls MPI_Finalize at interpreter exit; this only disarms the abort hook.
        self.shut_down = True

    def _abort_unless_shut_down(self) -> None:
        # A rank leaving with an exception would reach mpi4py's MPI_Finalize at exit, which waits
        # for peers blocked in a collective: the job hung (measured). MPI_Abort ends every rank.
        if not self.shut_down and self.comm is not None and self.comm.size > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            self.comm.mpi_comm.Abort(1)


class _TrainingState:
    """Rank 0's share as one chainer-serializable object: model, optimizer, data position."""

    def __init__(self, workload: ChainerWorkload, step: int) -> None:
        self.workload, self.step = workload, step

    def serialize(self, serializer: chainer.AbstractSerializer) -> None:
        workload = self.workload
        assert workload.model is not None and workload.optimizer is not None
        serializer("step", self.step)
        serializer("data_position", self.step)  # batches are a function of the step
        serializer("hidden_width", workload.width)
        workload.model.serialize(serializer["model"])
        workload.optimizer.serialize(serializer["optimizer"])  # Adam's t, epoch, m and v


def _npz_arrays(target: Any, staging: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays chainer's save_npz would store for ``target``, each copied into ``staging``'s
    buffer of that name (reused: memory already touched; the next snapshot waits for this write)."""
    serializer = serializers.DictionarySerializer()
    serializer.save(target)
    copies = {}
    for key, value in serializer.target.items():
        array = np.asarray(value)
        buffer = staging.get(key)
        if buffer is None or buffer.shape != array.shape or buffer.dtype != array.dtype:
            buffer = staging[key] = np.empty_like(array, order="C")
        np.copyto(buffer, array)
        copies[key] = buffer
    return copies


def _open_npz(path: Path) -> Any:
    # One sequential read, then parse from memory; allow_pickle=False (chainer's load_npz allows
    # pickle) since every entry is a plain array.
    return np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)


def _join(env: DistEnv) -> Any:
    """MPI_Init (importing mpi4py.MPI) and the ChainerMN communicator over COMM_WORLD."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if (world.Get_size(), world.Get_rank()) != (env.world_size, env.rank):
        raise RuntimeError(
            f"MPI says rank {world.Get_rank()} of {world.Get_size()}, the scheduler rank {env.rank} of "
            f"{env.world_size}: start Chainer ranks with an MPI launcher (mpiexec -n N, srun --mpi=pmix)"
        )
    return packed_communicator_class()(world)


@functools.cache
def packed_communicator_class() -> type:
    """ChainerMN's CPU ("naive") communicator, with every gradient in one MPI_Allreduce a step.

    Defined on first use: chainermn's communicator modules import mpi4py.MPI, which runs MPI_Init,
    and merely importing this module (to build a model, on a login node) must not.
    """
    from chainermn.communicators.naive_communicator import NaiveCommunicator

    class PackedCommunicator(NaiveCommunicator):
        """``create_communicator("naive")`` all-reduces each parameter array on its own; "flat",
        which packs them, needs CuPy. Each all-reduce is a point where every rank must hold a core,
        and on shared, oversubscribed cores those waits cost more than the bytes (measured once, 2
        ranks on 2 cores busy with other work, 100k-parameter MLP: median 46 ms a step naive, 27 ms
        packed; 2000 parameters: 15 and 13 ms). The mean is naive's sum-then-scale, bit for bit.
        With a fixed world size and buffer size Open MPI picks the same reduction algorithm every
        step, so the sums repeat exactly.
        """

        def __init__(self, mpi_comm: Any) -> None:
            super().__init__(mpi_comm)
            self._buffer = np.empty(0, dtype=np.float32)

        def multi_node_mean_grad(self, model: chainer.Link, zero_fill: bool = False) -> None:
            params = [param for _, param in sorted(model.namedparams())
                      if param.array is not None and (zero_fill or param.grad is not None)]
            for param in params:
                if param.grad is None:  # zero_fill: a parameter this rank's loss did not reach
                    param.grad = np.zeros_like(param.array)  # type: ignore[misc]  # Variable.grad has a setter, which mypy misses (not next to its getter)
            # Every grad is set now (a property: mypy cannot narrow it).
            grads = [cast(np.ndarray, param.grad).ravel() for param in params]
            if not grads:
                return
            if {grad.dtype for grad in grads} != {np.dtype(np.float32)}:
                raise TypeError("PackedCommunicator all-reduces float32 gradients only")
            size = sum(grad.size for grad in grads)
            if self._buffer.size != size:
                self._buffer = np.empty(size, dtype=np.float32)
            np.concatenate(grads, out=self._buffer)
            self._multi_node_mean(None, self._buffer)  # in place: MPI_Allreduce(SUM), then * 1/size
            offset = 0
            for param, grad in zip(params, grads, strict=False):
                target = cast(np.ndarray, param.grad)
                target[...] = self._buffer[offset:offset + grad.size].reshape(target.shape)
                offset += grad.size

    return PackedCommunicator


def _prime(optimizer: Any, model: chainer.Link, comm: Any) -> None:
    """Broadcast rank 0's weights and make the next ``update`` a real one.

    ChainerMN's multi-node optimizer treats its first ``update`` of a process (any call where the
    parameter set looks new) as a weight broadcast and skips the Adam step. A resumed process
    would then drop the first step after the checkpoint, and even a fresh run would drop step 1.
    Doing the broadcast here and recording the parameter set as seen keeps every update real.
    """
    comm.bcast_data(model)
    if not optimizer.is_changed(model):  # records the parameter set; a first call sees a change
        raise RuntimeError("chainermn's multi-node optimizer had already seen this model: cannot prime it")
