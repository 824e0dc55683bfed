"""A Keras callback that drills ``model.fit`` with no drill code of its own:

    from experiments.runtime.keras_callback import FaultdrillKerasCallback

    drill = FaultdrillKerasCallback(steps_per_epoch=20)   # where to resume, agreed by all ranks
    model.fit(x, y, batch_size=..., steps_per_epoch=20, epochs=drill.epochs,
              initial_epoch=drill.initial_epoch, callbacks=[drill])

It reports every batch (heartbeat, first step, loss), checkpoints at the spec's interval through
the store (the model's weights and the optimizer's variables as one .npz, restored in place when
training begins), checkpoints and stops on the scheduler's warning, and records the final
weights. Keras resumes at an epoch's start, so the checkpoint interval must be a multiple of
``steps_per_epoch`` (an error says so); a checkpoint taken on the warning in the middle of an
epoch resumes at that epoch's start with the state of the warned step (not bit for bit).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import keras
import numpy as np

from experiments.runtime import api

STATE_FILE = "keras-state.npz"
FORMAT = f"Keras variables as .npz, keras {keras.__version__}"


class FaultdrillKerasCallback(keras.callbacks.Callback):
    def __init__(self, steps_per_epoch: int, **init_options: Any) -> None:
        super().__init__()
        self.rank = api.init(framework="tensorflow", file_format=FORMAT, **init_options)
        every = self.rank.checkpoint_every
        if every % steps_per_epoch:
            raise ValueError(f"checkpoint.every_steps ({every}) must be a multiple of steps_per_epoch "
                             f"({steps_per_epoch}): Keras resumes at the start of an epoch")
        self.steps_per_epoch = steps_per_epoch
        self.found = self.rank.resume()
        self._warned_at: int | None = None

    @property
    def initial_epoch(self) -> int:
        """The epoch to start at: give it to ``fit(initial_epoch=...)``."""
        return (self.found.step if self.found is not None else 0) // self.steps_per_epoch

    @property
    def epochs(self) -> int:
        """Epochs to the run's last step: give it to ``fit(epochs=...)``."""
        return -(-self.rank.steps // self.steps_per_epoch)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.found is not None:
            _restore(self.model, self.found.path / STATE_FILE)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = self.model.optimizer.iterations.numpy().item()
        loss = (logs or {}).get("loss")
        self.rank.step(step, None if loss is None else float(loss))
        warned = self.rank.preempted(step)
        if warned or self.rank.should_checkpoint(step):
            with self.rank.checkpoint(step) as directory:
                _save(self.model, Path(directory) / STATE_FILE)
        if warned:
            self._warned_at = step
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._warned_at is not None:
            self.rank.hold(self._warned_at)  # does not return: the next job resumes there
        step = self.model.optimizer.iterations.numpy().item()
        self.rank.done(weights=[(variable.path, variable.numpy()) for variable in self.model.weights], step=step)


def _variables(model: keras.Model) -> dict[str, Any]:
    found = {f"model/{v.path}": v for v in model.weights}
    found.update({f"optimizer/{v.path}": v for v in model.optimizer.variables})
    return found


def _save(model: keras.Model, path: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **{name: variable.numpy() for name, variable in _variables(model).items()})
    path.write_bytes(buffer.getvalue())


def _restore(model: keras.Model, path: Path) -> None:
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    saved = np.load(path)
    variables = _variables(model)
    missing = sorted(set(saved.files) ^ set(variables))
    if missing:
        raise ValueError(f"{path}: the saved variables do not match the model's: {missing[:5]}")
    for name, variable in variables.items():
        variable.assign(saved[name])
