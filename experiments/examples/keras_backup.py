"""Keras 3 ``model.fit`` with ``BackupAndRestore(save_freq=N)``, knowing nothing of Faultdrill
(zero-code): the resume Keras's documentation describes. Rank 0 prints ``step N`` after each batch
(N: the optimizer's iterations, which the backup restores) and the final weights go to
``final.weights.h5`` (the drill's ``workload.outputs``); ``--step-log DIR`` appends ``<pid> <step>
<time>`` per batch to ``DIR/steps-0.log``: what really ran.

A backup taken mid-epoch restores the weights and the optimizer's iterations; whether the epoch's
data resumes at the batch after it or starts over is Keras's to decide (Keras 3 before 3.6 started
the epoch again: more optimizer steps than planned, and weights unlike an uninterrupted run's). The
drill's report says which happened: the step count against the plan, the weights against the twin's.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from step_log import StepLog  # noqa: E402

STEPS_PER_EPOCH, BATCH = 50, 16


class StepLines(keras.callbacks.Callback):
    def __init__(self, log: Path | None) -> None:
        super().__init__()
        self.steps = StepLog(log)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.steps.ran(int(self.model.optimizer.iterations.numpy()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-freq", type=int, default=20)
    parser.add_argument("--step-log", type=Path)
    args = parser.parse_args()

    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    images = rng.standard_normal((STEPS_PER_EPOCH * BATCH, 8)).astype("float32")
    labels = (images[:, :3].mean(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = keras.callbacks.BackupAndRestore(backup_dir="backup", save_freq=args.save_freq)
    model.fit(images, labels, batch_size=BATCH, shuffle=False, verbose=0, epochs=args.steps // STEPS_PER_EPOCH,
              callbacks=[backup, StepLines(args.step_log)])
    model.save_weights("final.weights.h5")


if __name__ == "__main__":
    main()
