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
    ChainerWorkload, _RngState, build_model, dropout_rng, param_count)
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

# The dropout generator survives a save_npz/load round trip, mid-stream.
workload = ChainerWorkload()
workload.rng = dropout_rng(3, 1)
workload._mask((4, 5))
buffer = io.BytesIO()
serializers.save_npz(buffer, _RngState(workload.rng), compression=False)
expected = workload._mask((64, 7))
restored = dropout_rng(0, 0)
with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as npz:
    NpzDeserializer(npz).load(_RngState(restored))
workload.rng = restored
found["mask_dtype"] = str(expected.dtype)
found["mask_roundtrip"] = bool(np.array_equal(workload._mask((64, 7)), expected))
found["keep_fraction"] = float((expected > 0).mean())
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


def test_dropout_generator_round_trips_through_save_npz(probe: dict[str, Any]) -> None:
    assert probe["mask_dtype"] == "float32"
    assert probe["mask_roundtrip"]
    assert 0.8 < probe["keep_fraction"] < 0.97  # DROPOUT = 0.1


def test_importing_the_workload_does_not_start_mpi(probe: dict[str, Any]) -> None:
    assert probe["mpi_initialised"] is False
