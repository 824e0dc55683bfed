"""The seeded synthetic data and the model family every framework trains (framework-neutral).

All frameworks draw their batches here, as NumPy arrays, so PyTorch, TensorFlow and Chainer see
the very same data in the very same order: a batch is a pure function of (seed, step, rank), which
is what lets a resumed run continue the data order without saving a loader's state.

Models (identical architecture in every framework; the parameter count follows the spec's knob):
- ``mlp``: IN_FEATURES -> h -> h -> OUT_FEATURES, ReLU, dropout DROPOUT after each hidden layer.
- ``cnn``: IMAGE (IMAGE_SIZE x IMAGE_SIZE x 1) -> conv3x3(c, same) -> ReLU -> conv3x3(c, same) -> ReLU
  -> global average pool -> dense OUT_FEATURES; no dropout.
Loss: mean squared error against ``tanh(features @ teacher)``; optimizer: Adam(LEARNING_RATE).
"""

from __future__ import annotations

import functools
import math

import numpy as np

IN_FEATURES = 64
OUT_FEATURES = 8
IMAGE_SIZE = 16
DROPOUT = 0.1
LEARNING_RATE = 1e-3
MODELS = ("mlp", "cnn")

DATA_STREAM = 0
DROPOUT_STREAM = 1
TEACHER_STREAM = 2


def mixed_seed(*parts: int) -> int:
    """A 63-bit generator seed from non-negative ints: SeedSequence mixes them well, so nearby
    (seed, step, rank) tuples give unrelated streams."""
    state = np.random.SeedSequence(list(parts)).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


@functools.lru_cache(maxsize=4)
def teacher(seed: int) -> np.ndarray:
    """The fixed map the model learns: IN_FEATURES x OUT_FEATURES, float32; made once per seed
    (every batch uses it) and read-only, as it is shared."""
    rng = np.random.default_rng(mixed_seed(seed, TEACHER_STREAM))
    weights = rng.standard_normal((IN_FEATURES, OUT_FEATURES)).astype(np.float32)
    weights.flags.writeable = False
    return weights


def mlp_batch(seed: int, step: int, rank: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (batch, IN_FEATURES) and targets (batch, OUT_FEATURES), float32."""
    rng = np.random.default_rng(mixed_seed(seed, DATA_STREAM, step, rank))
    inputs = rng.standard_normal((batch_size, IN_FEATURES)).astype(np.float32)
    return inputs, np.tanh(inputs @ teacher(seed)).astype(np.float32)


def cnn_batch(seed: int, step: int, rank: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (batch, IMAGE_SIZE, IMAGE_SIZE, 1) channels-last, and targets (batch, OUT_FEATURES).

    The target depends on the first IN_FEATURES pixels (the top rows), so convolutions have
    something spatial to learn. Frameworks that want channels-first transpose to (batch, 1, H, W).
    """
    rng = np.random.default_rng(mixed_seed(seed, DATA_STREAM, step, rank))
    images = rng.standard_normal((batch_size, IMAGE_SIZE, IMAGE_SIZE, 1)).astype(np.float32)
    features = images.reshape(batch_size, -1)[:, :IN_FEATURES]
    return images, np.tanh(features @ teacher(seed)).astype(np.float32)


def mlp_param_count(width: int) -> int:
    """in->h->h->out with biases: h^2 + (in + out + 2) h + out."""
    return width * width + (IN_FEATURES + OUT_FEATURES + 2) * width + OUT_FEATURES


def cnn_param_count(channels: int) -> int:
    """conv 1->c (9c + c), conv c->c (9c^2 + c), dense c->out (c*out + out)."""
    return 9 * channels * channels + (9 + 1 + 1 + OUT_FEATURES) * channels + OUT_FEATURES


def _closest(params: int, count, a: int, b: int) -> int:
    root = (-b + math.sqrt(b * b + 4 * a * max(params - OUT_FEATURES, 0))) / (2 * a)
    candidates = {max(1, math.floor(root)), max(1, math.ceil(root))}
    return min(candidates, key=lambda size: (abs(count(size) - params), size))


def mlp_width(params: int) -> int:
    """Hidden width whose MLP parameter count is closest to ``params``."""
    return _closest(params, mlp_param_count, 1, IN_FEATURES + OUT_FEATURES + 2)


def cnn_channels(params: int) -> int:
    """Channel count whose CNN parameter count is closest to ``params``."""
    return _closest(params, cnn_param_count, 9, 9 + 1 + 1 + OUT_FEATURES)


def model_size(model: str, params: int) -> tuple[int, int]:
    """(width or channels, exact parameter count) of ``model`` for the spec's ``params``."""
    if model == "mlp":
        width = mlp_width(params)
        return width, mlp_param_count(width)
    if model == "cnn":
        channels = cnn_channels(params)
        return channels, cnn_param_count(channels)
    raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
