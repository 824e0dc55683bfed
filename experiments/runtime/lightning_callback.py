"""A PyTorch Lightning callback that drills a Trainer with no drill code of its own:

    from experiments.runtime.lightning_callback import FaultdrillCallback

    drill = FaultdrillCallback()                        # where to resume, agreed by all ranks
    trainer = Trainer(..., max_steps=drill.steps, callbacks=[drill])
    trainer.fit(model, datamodule, ckpt_path=drill.ckpt_path)

It reports every optimizer step (heartbeat, first step, loss), checkpoints at the spec's interval
through the store (Lightning's own checkpoint file plus every rank's RNG states, so that dropout
draws what the uninterrupted run drew), checkpoints and stops on the scheduler's warning, and
records the final weights. A checkpoint's RNG states are those the next batch starts with (a new
epoch's DataLoader iterator draws from the global generator in between). Checkpoints are written at the end of the batch that finished the
step (as Lightning's ModelCheckpoint does every_n_train_steps): one at an epoch's last batch
resumes exactly (measured: a checkpoint written in on_train_epoch_end or _start made Lightning
train one batch more of the old epoch on resume); one in the middle of an epoch restarts a plain
DataLoader's epoch, so give the epoch a length that divides the interval, or a stateful loader.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from experiments.runtime import api, torch_state

CHECKPOINT_FILE = "lightning.ckpt"
FORMAT = f"Lightning checkpoint (torch.save), lightning {lightning.__version__}"


class FaultdrillCallback(Callback):
    def __init__(self, **init_options: Any) -> None:
        """``init_options``: those of ``api.init`` for a run by hand (steps, checkpoint_every)."""
        self.rank = api.init(framework="torch", file_format=FORMAT, **init_options)
        self.found = self.rank.resume()
        self._restore_rng = self.found is not None
        self._writing: tuple[ExitStack, Path] | None = None  # a checkpoint waiting for the RNG states
        self._warned_at: int | None = None

    @property
    def steps(self) -> int:
        """The step the run trains to: give it to the Trainer as max_steps."""
        return self.rank.steps

    @property
    def ckpt_path(self) -> str | None:
        """The Lightning checkpoint of the newest valid checkpoint (None: a cold start)."""
        return str(self.found.path / CHECKPOINT_FILE) if self.found is not None else None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # The RNG states as the next batch finds them: a new epoch's DataLoader iterator draws from
        # the global generator between one batch's end and the next one's start.
        if self._restore_rng:
            assert self.found is not None
            torch_state.set_rng_state(torch_state.load_file(self.found.path / torch_state.rng_file(self.rank.rank)))
            self._restore_rng = False
        self._finish_checkpoint()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        self.rank.step(step, _loss(outputs))
        warned = self.rank.preempted(step)
        if not (warned or self.rank.should_checkpoint(step)):
            return
        stack = ExitStack()
        directory = Path(stack.enter_context(self.rank.checkpoint(step)))
        trainer.save_checkpoint(directory / CHECKPOINT_FILE)  # rank 0 writes; every rank meets
        self._writing = (stack, directory)
        if warned:
            self._warned_at = step
            trainer.should_stop = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_checkpoint()
        if self._warned_at is not None:
            self.rank.hold(self._warned_at)  # does not return: the next job resumes at that step
        self.rank.done(weights=pl_module.state_dict(), step=trainer.global_step)

    def _finish_checkpoint(self) -> None:
        """Add this rank's RNG states to the checkpoint in writing and publish it."""
        if self._writing is None:
            return
        stack, directory = self._writing
        self._writing = None
        with stack:
            torch.save(torch_state.rng_state(), directory / torch_state.rng_file(self.rank.rank))


def _loss(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else None
