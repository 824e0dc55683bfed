"""The TensorFlow workload in this process (world size 1): architectures, TF_CONFIG, checkpoint
files and a bitwise resume through the runner, for both models."""

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads, as the workload does
tf = pytest.importorskip("tensorflow")

from experiments.layout import (  # noqa: E402
    EVENT_CHECKPOINT_LOADED,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
)
from experiments.runner import RunnerOptions, run_training  # noqa: E402
from experiments.runtime.distenv import DistEnv, Timeouts  # noqa: E402
from experiments.workloads import get_workload  # noqa: E402
from experiments.workloads.synthetic import model_size  # noqa: E402
from experiments.workloads.tf_workload import TensorFlowWorkload, tf_config  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def single_env() -> DistEnv:
    return DistEnv.from_environ({"FAULTDRILL_MASTER_PORT": str(free_port())}, hostname="test")


def run_single(run_dir: Path, model: str, steps: int, attempt: int = 0, asynchronous: bool = True) -> str:
    job = RankJob(run_id="t", run_dir=str(run_dir), attempt=attempt,
                  workload=WorkloadSpec(framework="tensorflow", model=model, params=3000, steps=steps, batch_size=8),
                  checkpoint_every=10, checkpoint_keep=2, heartbeat_interval_s=0.0)
    outcome = run_training(job, single_env(), get_workload("tensorflow"), started_at=0.0,
                           options=RunnerOptions(async_persist=asynchronous))
    return outcome.digest


@pytest.mark.parametrize("model,params", [("mlp", 100_000), ("mlp", 1_000_000), ("cnn", 100_000), ("cnn", 3000)])
def test_parameter_count_matches_synthetic(model: str, params: int) -> None:
    workload = TensorFlowWorkload()
    timings = workload.setup(single_env(), WorkloadSpec(framework="tensorflow", model=model, params=params), Timeouts())
    expected = model_size(model, params)[1]
    assert sum(array.size for _, array in workload.named_weights()) == expected == timings["params"]
    assert sum(int(np.prod(v.shape)) for v in workload.model.trainable_variables) == expected


def test_architectures() -> None:
    workload = TensorFlowWorkload()
    workload.setup(single_env(), WorkloadSpec(framework="tensorflow", model="cnn", params=3000), Timeouts())
    channels = workload.width
    assert dict((name, a.shape) for name, a in workload.named_weights()) == {
        "conv1/kernel": (3, 3, 1, channels), "conv1/bias": (channels,),
        "conv2/kernel": (3, 3, channels, channels), "conv2/bias": (channels,),
        "output/kernel": (channels, 8), "output/bias": (8,)}
    inputs, _, _ = workload.batch(1)
    assert workload.strategy.experimental_local_results(inputs)[0].shape == (32, 16, 16, 1)


def test_tf_config_from_recorded_environments() -> None:
    local = {"SUBMITIT_LOCAL_JOB_ID": "7", "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_NTASKS": "2",
             "FAULTDRILL_MASTER_PORT": "41000"}
    assert tf_config(DistEnv.from_environ(local, hostname="h"), local) == {
        "cluster": {"worker": ["127.0.0.1:41000", "127.0.0.1:41001"]}, "task": {"type": "worker", "index": 1}}
    assert tf_config(single_env(), {}) is None  # one rank: no cluster, no gRPC server


def test_resume_reproduces_uninterrupted_digest(tmp_path: Path) -> None:
    for model in ("mlp", "cnn"):
        straight = run_single(tmp_path / f"{model}-straight", model, steps=30)
        run_single(tmp_path / f"{model}-broken", model, steps=17)  # last checkpoint: step 10
        resumed = run_single(tmp_path / f"{model}-broken", model, steps=30, attempt=1, asynchronous=False)
        assert resumed == straight, model
        paths = RunPaths(tmp_path / f"{model}-broken")
        loaded = next(e for e in attempt_event_lines(paths, 1) if e["event"] == EVENT_CHECKPOINT_LOADED)
        assert loaded["step"] == 10


def test_checkpoint_holds_weights_adam_and_position(tmp_path: Path) -> None:
    run_single(tmp_path, "mlp", steps=10)
    directory = RunPaths(tmp_path).checkpoints / "step-00000010"
    assert sorted(p.name for p in directory.iterdir()) == ["ckpt.data-00000-of-00001", "ckpt.index", "manifest.json"]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["writers"] == "rank0" and manifest["format"].startswith("tf.train.Checkpoint")
    names = {name for name, _ in tf.train.list_variables(str(directory / "ckpt"))}
    for expected in ("step/.ATTRIBUTES/VARIABLE_VALUE", "data_position/.ATTRIBUTES/VARIABLE_VALUE",
                     "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"):
        assert expected in names
    # Weights plus Adam's two slots per weight, float32: the data file is ~3x the raw parameters.
    params = model_size("mlp", 3000)[1]
    assert 3 * 4 * params <= manifest["bytes"] < 3 * 4 * params + 8192


def test_loading_another_width_fails(tmp_path: Path) -> None:
    run_single(tmp_path, "mlp", steps=10)
    workload = TensorFlowWorkload()
    workload.setup(single_env(), WorkloadSpec(framework="tensorflow", params=5000), Timeouts())
    with pytest.raises(ValueError, match="[Ss]hape"):
        workload.load(RunPaths(tmp_path).checkpoints / "step-00000010", 10)


def test_a_non_chief_writes_nothing_into_a_checkpoint(tmp_path: Path) -> None:
    """Only the chief's files are published, and the chief's copy needs no collective: the other
    workers write nothing (issue 7, item 13: none leaves a scratch copy anywhere, /tmp included)."""
    from experiments.runtime.checkpoint import CheckpointStore

    workload = TensorFlowWorkload()
    workload.env = DistEnv.from_environ({"SUBMITIT_LOCAL_JOB_ID": "1", "SUBMITIT_LOCAL_GLOBALID": "1",
                                         "SUBMITIT_LOCAL_NTASKS": "2", "FAULTDRILL_MASTER_PORT": "30000"})
    workload.counters = {name: tf.Variable(0, dtype=tf.int64) for name in ("step", "data_position", "hidden_width")}
    store = CheckpointStore(tmp_path)
    sink = store.sink(10, rank=1)
    workload.save(sink, 10)
    assert list(store.partial_dir(10).iterdir()) == [] and sink.written == {}


def test_a_snapshot_holds_its_step_while_training_goes_on_before_it_is_written(tmp_path: Path) -> None:
    """Issue 24: the chief's snapshot is a copy of the state (its shadow), so the write that comes
    later, on the persist thread, writes the step it was taken at, whatever training did since;
    the files are TensorFlow's own checkpoint, which the workload's own checkpoint restores."""
    from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore

    spec = WorkloadSpec(framework="tensorflow", model="mlp", params=3000, batch_size=8)
    workload = TensorFlowWorkload()
    workload.setup(single_env(), spec, Timeouts())
    for step in range(1, 6):
        workload.train_step(step)
    at_five = workload.digest()
    store = CheckpointStore(tmp_path)
    sink = store.sink(5)
    write = workload.snapshot(sink, 5)
    state_at_five = [variable.numpy() for variable in workload._state_variables()]  # Adam's slots, the RNG, counters
    for step in range(6, 9):  # training goes on before the write
        workload.train_step(step)
    assert workload.digest() != at_five
    write()
    sink.close()
    store.commit(5, 0, CheckpointMeta("tensorflow", "tf.train.Checkpoint", "rank0"), 0.0, blocking_s=None)
    restored = TensorFlowWorkload()
    restored.setup(single_env(), spec, Timeouts())
    restored.load(store.step_dir(5), 5)  # assert_consumed: the shadow's checkpoint has the workload's structure
    assert restored.digest() == at_five
    restored_state = [variable.numpy() for variable in restored._state_variables()]
    assert len(restored_state) == len(state_at_five)
    differ = [index for index, (got, expected) in enumerate(zip(restored_state, state_at_five, strict=True))
              if not np.array_equal(got, expected)]
    assert differ == [], f"state variables {differ} differ from step 5's"


def test_warm_up_leaves_every_variable_as_set_up_left_it_and_the_run_unchanged(tmp_path: Path) -> None:
    """A warm spare set runs a step while it waits (TensorFlow's first run of a traced step is
    slow); every variable a step changes must be put back bit for bit, so that a set that trains
    from step 0 (no checkpoint yet) ends as a run that never warmed up."""
    spec = WorkloadSpec(framework="tensorflow", model="mlp", params=3000, steps=5, batch_size=8)
    workload = TensorFlowWorkload()
    workload.setup(single_env(), spec, Timeouts())
    variables = workload._state_variables()
    before = [variable.numpy().copy() for variable in variables]
    workload.warm_up()
    after = [variable.numpy() for variable in variables]
    assert len(before) > len(workload.model.variables_in_order), "Adam's slots, the generator, the counters too"
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=False))
    losses = [workload.train_step(step) for step in (1, 2)]

    fresh = TensorFlowWorkload()
    fresh.setup(single_env(), spec, Timeouts())
    assert [fresh.train_step(step) for step in (1, 2)] == losses
    assert fresh.digest() == workload.digest()


def test_a_held_state_served_to_a_new_process_resumes_bit_for_bit() -> None:
    """Warm sets without rollback: a rank's state after step 6, held, served over the authenticated
    state channel and taken by a fresh workload, trains on to the uninterrupted run's weights (the
    masks are keyed by step; no RNG state to carry)."""
    from experiments.warm.protocol import new_secret
    from experiments.warm.state_channel import StateNotTaken, StateServer, fetch_state

    spec = WorkloadSpec(framework="tensorflow", model="mlp", params=3000, steps=10, batch_size=8)
    survivor, spare, twin = TensorFlowWorkload(), TensorFlowWorkload(), TensorFlowWorkload()
    assert survivor.serve_state() and spare.serve_state()  # the twin trains as a run outside a warm set does
    for workload in (survivor, spare, twin):
        workload.setup(single_env(), spec, Timeouts())
    spare.warm_up()
    for step in range(1, 7):
        survivor.train_step(step)
    secret = new_secret()
    server = StateServer(secret, lambda: (survivor.gate.completed, survivor.peer_state()),
                         held=lambda: survivor.gate.held)
    try:
        with pytest.raises(StateNotTaken, match="not held"):
            fetch_state("127.0.0.1", server.port, secret, 6)
        assert survivor.gate.hold() == 6
        with pytest.raises(StateNotTaken, match="secret"):
            fetch_state("127.0.0.1", server.port, new_secret(), 6)
        with pytest.raises(StateNotTaken, match="step 6"):
            fetch_state("127.0.0.1", server.port, secret, 7)
        spare.take_peer_state(fetch_state("127.0.0.1", server.port, secret, 6), 6)
    finally:
        server.close()
    assert spare.gate.completed == 6
    for step in range(7, 11):
        spare.train_step(step)
    for step in range(1, 11):
        twin.train_step(step)
    assert spare.digest() == twin.digest(), "split steps (a warm set's) are bit for bit the whole step"
    assert spare.digest() != survivor.digest()  # the survivor stopped at step 6
