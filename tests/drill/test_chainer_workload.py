"""The Chainer models against the shared model family, checked in a child process.

Chainer can only be imported by a Python started with SETUPTOOLS_USE_DISTUTILS=stdlib (it imports
numpy.distutils), which this pytest process was not, so the checks run in one child process that
prints its findings as JSON. MPI is not initialised there: building a model needs no communicator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from experiments.workloads.synthetic import model_size

if importlib.util.find_spec("chainer") is None:  # find_spec does not import it
    pytest.skip("chainer is not installed", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SIZES = [("mlp", 2000), ("mlp", 100_000), ("mlp", 1_000_000), ("cnn", 2000), ("cnn", 100_000)]

PROBE = """
import json, sys
import numpy as np
from experiments.workloads.chainer_workload import (
    ChainerWorkload, build_model, dropout_rng, param_count)
from chainer import serializers
from chainer.serializers.npz import NpzDeserializer
import io

sizes = json.loads(sys.argv[1])
found = {"counts": {}, "names": {}}
for model, size in sizes:
    link = build_model(model, size, seed=3)
    found["counts"][f"{model}-{size}"] = param_count(link)
    found["names"][model] = [name for name, _ in sorted(link.namedparams())]
    twin = build_model(model, size, seed=3)
    found.setdefault("same_init", []).append(all(
        np.array_equal(a.array, b.array) for a, b in zip(link.params(), twin.params())))

# The masks of a step are a function of (seed, rank, step): any process draws them again.
workload = ChainerWorkload()
workload.rng = dropout_rng(3, 1, 17)
expected = workload._mask((64, 7))
workload.rng = dropout_rng(3, 1, 17)
found["mask_dtype"] = str(expected.dtype)
found["mask_redrawn"] = bool(np.array_equal(workload._mask((64, 7)), expected))
workload.rng = dropout_rng(3, 1, 18)
found["mask_of_next_step_differs"] = not np.array_equal(workload._mask((64, 7)), expected)
found["keep_fraction"] = float((expected > 0).mean())

# A survivor's state (weights, Adam's t, m and v) taken by another process's workload: the same
# arrays, the same next update. Plain Adam stands in for the multi-node optimizer (no MPI here).
import chainer, chainer.functions as F
from experiments.workloads.synthetic import mlp_batch

def bare(size):
    bare = ChainerWorkload()
    bare.model, bare.width = build_model("mlp", size, seed=3), size
    bare.optimizer = chainer.optimizers.Adam(alpha=1e-3)
    bare.optimizer.setup(bare.model)
    return bare

def update(bare, step):
    inputs, targets = mlp_batch(3, step, 0, 8)
    bare.model.cleargrads()
    F.mean_squared_error(bare.model(inputs), targets).backward()
    with bare.gate.updating(step):
        bare.optimizer.update()

size = sizes[0][1]
survivor, spare = bare(size), bare(size)
for step in range(1, 4):
    update(survivor, step)
survivor.gate.hold()
state = survivor.peer_state()
spare.take_peer_state({name: np.array(array) for name, array in state.items()}, 3)
update(spare, 4)
twin = bare(size)
for step in range(1, 5):
    update(twin, step)
found["peer_state_completed"] = spare.gate.completed
found["peer_state_resumes_bitwise"] = all(
    np.array_equal(a.array, b.array) for a, b in zip(spare.model.params(), twin.model.params()))
try:
    spare.take_peer_state(state, 2)
    found["wrong_step_refused"] = False
except ValueError:
    found["wrong_step_refused"] = True
found["mpi_initialised"] = "mpi4py.MPI" in sys.modules  # building models must not run MPI_Init
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    sizes = [[model, model_size(model, params)[0]] for model, params in SIZES]
    env = {**os.environ, "SETUPTOOLS_USE_DISTUTILS": "stdlib", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(sizes)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("model", "params"), SIZES)
def test_parameter_count_matches_the_shared_family(probe: dict[str, Any], model: str, params: int) -> None:
    size, expected = model_size(model, params)
    assert probe["counts"][f"{model}-{size}"] == expected


def test_parameter_names_are_stable_link_paths(probe: dict[str, Any]) -> None:
    assert probe["names"]["mlp"] == ["/l1/W", "/l1/b", "/l2/W", "/l2/b", "/l3/W", "/l3/b"]
    assert probe["names"]["cnn"] == ["/conv1/W", "/conv1/b", "/conv2/W", "/conv2/b", "/fc/W", "/fc/b"]


def test_initial_weights_are_a_function_of_the_seed(probe: dict[str, Any]) -> None:
    assert all(probe["same_init"])


def test_dropout_masks_are_a_function_of_seed_rank_and_step(probe: dict[str, Any]) -> None:
    assert probe["mask_dtype"] == "float32"
    assert probe["mask_redrawn"] and probe["mask_of_next_step_differs"]
    assert 0.8 < probe["keep_fraction"] < 0.97  # DROPOUT = 0.1


def test_a_survivors_state_taken_by_another_workload_makes_the_same_next_update(probe: dict[str, Any]) -> None:
    assert probe["peer_state_completed"] == 4
    assert probe["peer_state_resumes_bitwise"]
    assert probe["wrong_step_refused"]


def test_importing_the_workload_does_not_start_mpi(probe: dict[str, Any]) -> None:
    assert probe["mpi_initialised"] is False
