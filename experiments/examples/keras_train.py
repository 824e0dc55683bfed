"""Keras model.fit drilled by the callback (the lines marked `# drill`).

A small convolutional classifier on synthetic images (random weights, nothing downloaded); the data
is fixed by the seed and not shuffled, so a resumed run sees what an uninterrupted one saw.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from experiments.runtime.keras_callback import FaultdrillKerasCallback  # noqa: E402  # drill

STEPS_PER_EPOCH, BATCH = 20, 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--filters", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    drill = FaultdrillKerasCallback(steps_per_epoch=STEPS_PER_EPOCH, steps=200, checkpoint_every=40)  # drill
    keras.utils.set_random_seed(drill.rank.seed)
    rng = np.random.default_rng(drill.rank.seed)
    images = rng.standard_normal((STEPS_PER_EPOCH * BATCH, 12, 12, 1)).astype("float32")
    labels = (images[:, :6].mean(axis=(1, 2, 3)) > 0).astype("int32")
    model = keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(args.filters, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer=keras.optimizers.Adam(args.lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images, labels, batch_size=BATCH, shuffle=False, verbose=0,
              epochs=drill.epochs, initial_epoch=drill.initial_epoch, callbacks=[drill])  # drill


if __name__ == "__main__":
    main()
