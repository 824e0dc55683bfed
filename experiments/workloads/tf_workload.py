"""TensorFlow workload: the MLP or the CNN of ``synthetic``, trained with MultiWorkerMirroredStrategy.

One worker per rank, one CPU replica per worker, ring all-reduce over gRPC; a custom loop
(``strategy.run`` inside ``tf.function``), because Keras 3 ``model.fit`` fails under this strategy
(CLUSTER-NOTES). The model is plain ``tf.Variable``s in a ``tf.Module`` so that variable names,
initial values and the dropout RNG are all under this module's control.

Bitwise reproducibility across a restart rests on: the batch of a step is a pure function of
(seed, step, rank), and so are the dropout masks (stateless draws keyed by them: no rank holds
state another cannot rebuild, so any survivor's state is the whole run's, see
experiments/warm/state_channel.py); weights, Adam's slots and iteration count are checkpointed. A
step is two traced functions: the gradients and their all-reduce (a dead peer breaks or blocks
only this one), then Adam's update, inside the workload's ``StateGate``. ``enable_op_determinism`` is on as a guard,
though on CPU it is not what makes the resume exact (measured: identical digests without it).
"""

from __future__ import annotations

import os
import shutil

# Before TensorFlow's C++ runtime loads: warnings and info lines off (errors still print).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, ContextManager, Iterator, Mapping  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from experiments.layout import WorkloadSpec  # noqa: E402
from experiments.runtime.checkpoint import CheckpointMeta  # noqa: E402
from experiments.runtime.distenv import DistEnv, Timeouts, task_addresses  # noqa: E402
from experiments.runtime.sink import FileSink  # noqa: E402
from experiments.runtime.snapshot import ShareWriter  # noqa: E402
from experiments.runtime.state_gate import StateGate  # noqa: E402
from experiments.workloads.base import StateArrays, Workload  # noqa: E402
from experiments.workloads.synthetic import (  # noqa: E402
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

# tf.train.Checkpoint.write(<dir>/ckpt) writes ckpt.index and ckpt.data-00000-of-00001.
CHECKPOINT_PREFIX = "ckpt"


def tf_config(env: DistEnv, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The TF_CONFIG of this rank (every rank a "worker", worker 0 the chief); None for one rank.

    Built from Faultdrill's own view of the job rather than TensorFlow's SlurmClusterResolver, which
    fails on CPU-only nodes (it calls nvidia-smi; ``gpus_per_node=0`` raises "range() arg 3 must not
    be zero"), reports a GPU per task when given fake GPU counts (the strategy then places replicas
    on a GPU that does not exist), sorts hosts by name (``n[9-10]`` makes rank 0 ``n10``, not
    Slurm's ``n9``) and uses one fixed port base for every job. ``task_addresses`` maps ranks to
    hosts as Slurm (block), PBS (by slot) and the local executor (loopback) place them, with one
    port per rank on a host.
    """
    if env.world_size == 1:
        return None  # a single worker needs no cluster (and no gRPC server)
    return {"cluster": {"worker": task_addresses(env, environ)}, "task": {"type": "worker", "index": env.rank}}


def _glorot(shape: tuple[int, ...], fan_in: int, fan_out: int, seed: tuple[int, int]) -> tf.Tensor:
    limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
    return tf.random.stateless_uniform(shape, seed=seed, minval=-limit, maxval=limit)


class SyntheticModel(tf.Module):
    """``synthetic``'s MLP or CNN as named variables (Keras' default init: Glorot kernels, zero biases)."""

    def __init__(self, model: str, size: int, seed: int, initialize: bool = True) -> None:
        """``initialize`` False: zeros (a shadow whose values are copied in: TensorFlowWorkload.snapshot)."""
        super().__init__(name=model)
        self.model = model
        shapes = mlp_shapes(size) if model == "mlp" else cnn_shapes(size)
        self.weights: dict[str, tf.Variable] = {}
        for index, (name, shape) in enumerate(shapes):
            if name.endswith("/bias") or not initialize:
                initial = tf.zeros(shape)
            else:
                receptive = int(np.prod(shape[:-2])) if len(shape) == 4 else 1
                initial = _glorot(shape, shape[-2] * receptive, shape[-1] * receptive, (seed, index))
            self.weights[name] = tf.Variable(initial, name=name.replace("/", "_"))
        # Gradients and Adam's slots follow this order (the checkpoint names slots by position).
        self.variables_in_order = [self.weights[name] for name, _ in shapes]

    def __call__(self, inputs: tf.Tensor, dropout_seed: tf.Tensor | None) -> tf.Tensor:
        """``dropout_seed``: this step's on this rank (dropout_seed()); None: no dropout."""
        w = self.weights
        if self.model == "mlp":
            hidden = _dropout(tf.nn.relu(inputs @ w["hidden1/kernel"] + w["hidden1/bias"]), dropout_seed, 1)
            hidden = _dropout(tf.nn.relu(hidden @ w["hidden2/kernel"] + w["hidden2/bias"]), dropout_seed, 2)
            return hidden @ w["output/kernel"] + w["output/bias"]
        hidden = tf.nn.relu(tf.nn.conv2d(inputs, w["conv1/kernel"], 1, "SAME") + w["conv1/bias"])
        hidden = tf.nn.relu(tf.nn.conv2d(hidden, w["conv2/kernel"], 1, "SAME") + w["conv2/bias"])
        pooled = tf.reduce_mean(hidden, axis=[1, 2])
        return pooled @ w["output/kernel"] + w["output/bias"]



def dropout_seed(seed: int, rank: int, step: int) -> np.ndarray:
    """The key of a step's masks on a rank: (a 63-bit mix of seed and rank, the step)."""
    return np.array([mixed_seed(seed, DROPOUT_STREAM, rank), step], dtype=np.int64)


def _dropout(values: tf.Tensor, seed: tf.Tensor | None, layer: int) -> tf.Tensor:
    if seed is None:
        return values
    uniform = tf.random.stateless_uniform(tf.shape(values), seed=tf.random.experimental.stateless_fold_in(seed, layer))
    keep = tf.cast(uniform >= DROPOUT, values.dtype)
    return values * keep / (1.0 - DROPOUT)


class _PreReducedAdam(tf.keras.optimizers.Adam):
    """Adam whose gradients come all-reduced already (the step's first function did it): Keras'
    own all-reduce under the strategy would sum them over the ranks a second time."""

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
        return list(grads_and_vars)


def _check_pre_reduced() -> None:
    """What _PreReducedAdam overrides is Keras' own (a private method of Keras 3's TensorFlow
    optimizer): were it renamed, the gradients would be summed over the ranks twice, inside the
    state's gate. Refused at set-up instead."""
    if not callable(getattr(tf.keras.optimizers.Adam, "_all_reduce_sum_gradients", None)):
        raise RuntimeError(f"keras {getattr(tf.keras, '__version__', '?')}: its TensorFlow optimizer has no _all_reduce_sum_gradients; "
                           "Faultdrill's TensorFlow workload needs the Keras 3 releases that have it")


COUNTERS = ("step", "data_position", "hidden_width")


def _counters() -> dict[str, tf.Variable]:
    return {name: tf.Variable(0, dtype=tf.int64, name=name) for name in COUNTERS}


def state_variables(model: SyntheticModel, optimizer: Any, counters: dict[str, tf.Variable]) -> list[tf.Variable]:
    """Everything a step changes, as the checkpoint holds it: weights, Adam's slots and iteration
    count, the counters (the same order for a workload and its shadow)."""
    return [*model.variables_in_order, *optimizer.variables, *counters.values()]


@dataclass(frozen=True)
class _Shadow:
    checkpoint: tf.train.Checkpoint
    variables: list[tf.Variable]  # in state_variables' order


def mlp_shapes(width: int) -> list[tuple[str, tuple[int, ...]]]:
    return [("hidden1/kernel", (IN_FEATURES, width)), ("hidden1/bias", (width,)),
            ("hidden2/kernel", (width, width)), ("hidden2/bias", (width,)),
            ("output/kernel", (width, OUT_FEATURES)), ("output/bias", (OUT_FEATURES,))]


def cnn_shapes(channels: int) -> list[tuple[str, tuple[int, ...]]]:
    return [("conv1/kernel", (3, 3, 1, channels)), ("conv1/bias", (channels,)),
            ("conv2/kernel", (3, 3, channels, channels)), ("conv2/bias", (channels,)),
            ("output/kernel", (channels, OUT_FEATURES)), ("output/bias", (OUT_FEATURES,))]


class TensorFlowWorkload(Workload):
    framework = "tensorflow"
    determinism = ("tf.config.experimental.enable_op_determinism() (a guard: CPU resumes were identical "
                   "without it); dropout masks drawn statelessly from (seed, rank, step); weights, "
                   "Adam's slots and iteration count checkpointed")

    def __init__(self) -> None:
        self.env: DistEnv | None = None
        self.spec = WorkloadSpec()
        self.timeouts = Timeouts()
        self.strategy: tf.distribute.Strategy | None = None
        self.model: SyntheticModel | None = None
        self.optimizer: Any = None
        self.checkpoint: tf.train.Checkpoint | None = None
        self.counters: dict[str, tf.Variable] = {}
        self.width = 0
        self._step_fn: tf.types.experimental.PolymorphicFunction | None = None  # the whole step, one function
        self._reduce_fn: tf.types.experimental.PolymorphicFunction | None = None  # split (serve_state): its all-reduce
        self._apply_fn: tf.types.experimental.PolymorphicFunction | None = None  # split: its update
        self.gate = StateGate()
        self.split = False
        self._shadow: _Shadow | None = None  # the chief's copy of the state, written off the training thread

    @property
    def checkpoint_meta(self) -> CheckpointMeta:
        # Only the chief's files are published; the other workers write to scratch (see save).
        return CheckpointMeta(
            "tensorflow", f"tf.train.Checkpoint (TensorBundle index+data), tensorflow {tf.__version__}", "rank0"
        )

    def setup(self, env: DistEnv, spec: WorkloadSpec, timeouts: Timeouts) -> dict[str, float]:
        self.env, self.spec, self.timeouts = env, spec, timeouts
        _check_pre_reduced()
        _configure_runtime(spec.seed)
        started = time.monotonic()
        self.strategy = _join_cluster(env, timeouts)
        joined = time.monotonic()
        self.width, param_count = model_size(spec.model, spec.params)
        with self.strategy.scope():
            self.model = SyntheticModel(spec.model, self.width, spec.seed)
            adam = _PreReducedAdam if self.split else tf.keras.optimizers.Adam
            self.optimizer = adam(learning_rate=LEARNING_RATE, name="adam")
            self.optimizer.build(self.model.variables_in_order)
            self.counters = _counters()
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, **self.counters)
        built = time.monotonic()
        # Trace now: it takes a second or more, which would otherwise land in the first step (and
        # the study's step time), and ranks finish it at different times, which the first
        # all-reduce's short timeout would take for a dead peer.
        if self.split:
            self._reduce_fn, self._apply_fn = self._make_step_fns()
            reduce_concrete = self._reduce_fn.get_concrete_function(*self.batch(1))
            self._apply_fn.get_concrete_function(reduce_concrete.structured_outputs[1])
        else:
            self._step_fn = self._make_step_fn()
            self._step_fn.get_concrete_function(*self.batch(1))
        return {"rendezvous_s": joined - started, "build_s": built - joined,
                "trace_s": time.monotonic() - built, "params": float(param_count),
                "hidden_width": float(self.width)}

    def _replica_gradients(self) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, Any]]:
        """A replica's loss and its gradients, scaled by 1/replicas: summed over the ranks, that is
        DDP's mean of their gradients (both step forms below)."""
        strategy, model = self.strategy, self.model
        assert strategy is not None and model is not None
        variables, replicas = model.variables_in_order, strategy.num_replicas_in_sync

        def gradients(inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, Any]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(inputs, seed) - targets))
                scaled = loss / replicas
            return loss, tape.gradient(scaled, variables)

        return gradients

    def _make_step_fn(self) -> tf.types.experimental.PolymorphicFunction:
        """The whole step in one function (Keras' optimizer all-reduces the gradients). A peer's
        death is seen at once by a survivor blocked in it (measured: 0.12 s); the split is for warm
        sets only, whose survivors hold anyway."""
        strategy, optimizer, gradients = self.strategy, self.optimizer, self._replica_gradients()
        assert strategy is not None and self.model is not None
        variables = self.model.variables_in_order

        def replica_step(inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
            loss, grads = gradients(inputs, targets, seed)
            optimizer.apply_gradients(zip(grads, variables, strict=False))
            return loss

        @tf.function
        def step_fn(inputs: Any, targets: Any, seeds: Any) -> Any:
            return strategy.run(replica_step, args=(inputs, targets, seeds))

        return step_fn

    def _make_step_fns(self) -> tuple[tf.types.experimental.PolymorphicFunction, tf.types.experimental.PolymorphicFunction]:
        """The step's two functions: the loss and the all-reduced gradients (no variable changes),
        then Adam's update of them (no collective)."""
        strategy, optimizer, gradients = self.strategy, self.optimizer, self._replica_gradients()
        assert strategy is not None and self.model is not None
        variables = self.model.variables_in_order

        def replica_reduced(inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> Any:
            loss, grads = gradients(inputs, targets, seed)
            return loss, tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)

        def replica_update(reduced: Any) -> None:
            optimizer.apply_gradients(zip(reduced, variables, strict=False))

        @tf.function
        def reduce_fn(inputs: Any, targets: Any, seeds: Any) -> Any:
            return strategy.run(replica_reduced, args=(inputs, targets, seeds))

        @tf.function
        def apply_fn(reduced: Any) -> None:
            strategy.run(replica_update, args=(reduced,))

        return reduce_fn, apply_fn

    def batch(self, step: int) -> tuple[Any, Any, Any]:
        """This rank's batch of ``step`` and its dropout key as per-replica values (rank r's replica
        gets batch r)."""
        assert self.env is not None and self.strategy is not None
        make = mlp_batch if self.spec.model == "mlp" else cnn_batch
        inputs, targets = make(self.spec.seed, step, self.env.rank, self.spec.batch_size)
        rank = self.env.rank

        def local(array: np.ndarray) -> Callable[[Any], tf.Tensor]:
            def value_fn(context: Any) -> tf.Tensor:
                if context.replica_id_in_sync_group != rank:
                    raise RuntimeError(f"replica {context.replica_id_in_sync_group} is not rank {rank}")
                return tf.constant(array)
            return value_fn

        distribute = self.strategy.experimental_distribute_values_from_function
        seed = dropout_seed(self.spec.seed, rank, step)
        return distribute(local(inputs)), distribute(local(targets)), distribute(local(seed))

    def warm_up(self) -> None:
        """One step through the traced function, then every variable it touched put back, bit for
        bit. The first run of a traced step optimizes its graph and sets up the all-reduce's
        group: ~0.35 s locally, ~0.7 s on the Slurm cluster, which a warm spare set would otherwise
        pay as its first step after a failure."""
        variables = self._state_variables()
        saved = [variable.numpy() for variable in variables]
        self.train_step(1)
        for variable, value in zip(variables, saved, strict=False):
            variable.assign(value)
        self.gate.resumed(0)

    def _state_variables(self) -> list[tf.Variable]:
        assert self.model is not None and self.optimizer is not None
        return state_variables(self.model, self.optimizer, self.counters)

    def serve_state(self) -> bool:
        self.split = True
        return True

    def train_step(self, step: int) -> float:
        assert self.strategy is not None
        if not self.split:
            assert self._step_fn is not None
            loss = self._step_fn(*self.batch(step))  # the all-reduce: a dead peer raises here
            return float(self.strategy.experimental_local_results(loss)[0])
        assert self._reduce_fn is not None and self._apply_fn is not None
        loss, gradients = self._reduce_fn(*self.batch(step))  # the all-reduce: a dead peer raises (or blocks) here
        with self.gate.updating(step):
            self._apply_fn(gradients)
        return float(self.strategy.experimental_local_results(loss)[0])

    def snapshot(self, sink: FileSink, step: int) -> ShareWriter:
        """The chief's state copied into its shadow (plain variables of the same structure, kept
        from one checkpoint to the next: one copy each, into memory already touched), which the
        returned call writes as TensorFlow's own checkpoint (by path, into a scratch directory inside
        the checkpoint's partial directory), makes durable and part of the share (fsync and hash),
        on any thread: training waits for the copy alone. The other workers write nothing (only the
        chief's files are published; the copy needs no collective). Not TensorFlow's async option
        (CheckpointOptions(enable_async=True)): its copy of Keras 3 variables fails from the second
        save on ("tf.function only supports singleton tf.Variables created on the first call")."""
        assert self.env is not None
        for name in ("step", "data_position"):
            self.counters[name].assign(step)
        self.counters["hidden_width"].assign(self.width)
        if not self.env.is_main:
            return lambda: None
        shadow = self._shadow_state()
        for copy, variable in zip(shadow.variables, self._state_variables(), strict=True):
            copy.assign(variable)

        def write() -> None:
            scratch = sink.new_scratch()
            try:
                shadow.checkpoint.write(str(scratch / CHECKPOINT_PREFIX))
                for path in sorted(p for p in scratch.iterdir() if p.is_file()):
                    sink.adopt(path, path.name)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

        return write

    def _shadow_state(self) -> "_Shadow":
        """Built at the first checkpoint, outside the strategy (plain variables on this CPU)."""
        if self._shadow is None:
            with tf.device("/cpu:0"):
                model = SyntheticModel(self.spec.model, self.width, self.spec.seed, initialize=False)
                optimizer = tf.keras.optimizers.Adam(learning_rate=LEARNING_RATE)
                optimizer.build(model.variables_in_order)
                counters = _counters()
            self._shadow = _Shadow(tf.train.Checkpoint(model=model, optimizer=optimizer, **counters),
                                   state_variables(model, optimizer, counters))
        return self._shadow

    def load(self, directory: Path, step: int) -> None:
        assert self.checkpoint is not None
        prefix = directory / CHECKPOINT_PREFIX
        if not Path(f"{prefix}.index").exists():
            raise FileNotFoundError(f"{prefix}.index: no TensorFlow checkpoint in {directory}")
        self.checkpoint.read(str(prefix)).assert_consumed()
        found_step, width = int(self.counters["step"].numpy()), int(self.counters["hidden_width"].numpy())
        if found_step != step or width != self.width:
            raise ValueError(f"{prefix} holds step {found_step}, width {width}; "
                             f"expected step {step}, width {self.width}")
        self.gate.resumed(step)

    def peer_state(self) -> StateArrays:
        step = self.gate.completed
        for name in ("step", "data_position"):
            self.counters[name].assign(step)
        self.counters["hidden_width"].assign(self.width)
        return {f"{index:05d}": variable.numpy() for index, variable in enumerate(self._state_variables())}

    def take_peer_state(self, arrays: StateArrays, step: int) -> None:
        variables = self._state_variables()
        if len(arrays) != len(variables):
            raise ValueError(f"a survivor's state of {len(arrays)} variables; this model has {len(variables)}")
        for index, variable in enumerate(variables):
            variable.assign(arrays[f"{index:05d}"])
        held, width = int(self.counters["step"].numpy()), int(self.counters["hidden_width"].numpy())
        if held != step or width != self.width:
            raise ValueError(f"a survivor's state of step {held}, width {width}; expected step {step}, width {self.width}")
        self.gate.resumed(step)

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        assert self.model is not None
        return [(name, variable.numpy()) for name, variable in self.model.weights.items()]

    def barrier(self, timeout_s: float | None = None) -> None:
        self._sum_over_ranks(0, timeout_s)

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        assert self.env is not None
        return self._sum_over_ranks(value if self.env.is_main else 0, timeout_s)

    def _sum_over_ranks(self, value: int, timeout_s: float | None) -> int:
        """One eager all-reduce (every rank must call it, in the same order) with its own timeout."""
        assert self.strategy is not None
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout_s if timeout_s is not None else self.timeouts.collective_s)

        def replica_fn() -> tf.Tensor:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(value, tf.int64), options=options)

        result = self.strategy.run(replica_fn)
        return int(self.strategy.experimental_local_results(result)[0].numpy())

    def shutdown(self) -> None:
        # TensorFlow has no way to leave a cluster: the gRPC server lives as long as the process.
        self._step_fn = self._reduce_fn = self._apply_fn = None


def _configure_runtime(seed: int) -> None:
    """Threads, determinism and seeds, before the first op initialises TensorFlow's context."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # the context exists already (a second workload in one process, as in tests): still 1
    tf.config.experimental.enable_op_determinism()
    tf.random.set_seed(seed)
    tf.get_logger().setLevel("ERROR")


def _join_cluster(env: DistEnv, timeouts: Timeouts) -> tf.distribute.MultiWorkerMirroredStrategy:
    """The strategy over every rank: waits at most ``rendezvous_s`` for all workers; collectives
    time out after ``collective_s`` (how long a rank waits on a peer that vanished without a word)."""
    config = tf_config(env)
    waiting: ContextManager[None] = nullcontext()
    if config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = json.dumps(config)
        _configure_coordination(env.world_size, timeouts)
        waiting = _deadline(timeouts.rendezvous_s, f"rank {env.rank} joins the TensorFlow cluster")
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=timeouts.collective_s,
    )
    with waiting:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    _restore_sigterm()
    if strategy.num_replicas_in_sync != env.world_size:
        raise RuntimeError(f"{strategy.num_replicas_in_sync} replicas for {env.world_size} ranks")
    return strategy


def _configure_coordination(world_size: int, timeouts: Timeouts) -> None:
    """Configure TensorFlow's coordination service before the strategy does it with its defaults.

    With the strategy's defaults a worker waits very long for a peer that never starts (measured:
    rank 0 alone was still waiting after 4 minutes, deaf to SIGTERM, see ``_restore_sigterm``).
    Here registration waits ``rendezvous_s`` and a silent peer is declared dead after
    ``collective_s``. The strategy configures the service only if nobody has: the same settings
    it would make (leader task 0, every worker coordinated), through TensorFlow's internal API,
    which has no public equivalent.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return  # an earlier strategy in this process configured it; it cannot change now
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader="/job:worker/replica:0/task:0",
        cluster_register_timeout_in_ms=_millis(timeouts.rendezvous_s),
        heartbeat_timeout_in_ms=_millis(timeouts.collective_s),
        shutdown_barrier_timeout_in_ms=_millis(timeouts.collective_s),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=world_size)],
    )


def _millis(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """End the process by SIGALRM if the block has not finished after ``seconds``.

    The coordination service's leader (rank 0) waits for missing workers inside a C++ call that
    ignores ``cluster_register_timeout`` (measured: still waiting after a minute with it at 8 s)
    and holds the GIL, so neither an exception nor a timer thread can end the wait: the kernel's
    alarm, whose default action ends the process, can. Outside the main thread (tests) there is
    no deadline.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    sys.stderr.write(f"faultdrill: {what}; SIGALRM ends this rank if that takes over {seconds:g} s\n")
    signal.alarm(max(1, math.ceil(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)


def _restore_sigterm() -> None:
    """Let SIGTERM end the rank again.

    When the multi-worker runtime starts, TensorFlow installs a SIGTERM handler (its preemption
    notifier, ``tsl::PreemptionNotifier``) that swallows the signal (measured: a rank sent SIGTERM trained on to the end and exited 0), so an
    injected SIGTERM, or Slurm's at a cancel or time limit, would do nothing until the SIGKILL
    that follows. Faultdrill does not use TensorFlow's preemption checkpointing.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
