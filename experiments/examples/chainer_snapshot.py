"""A Chainer Trainer that knows nothing of Faultdrill (zero-code): ``extensions.snapshot(
autoload=True)`` every ``--every`` iterations into ``result/`` (Chainer's default ``out``, relative
to the working directory), which the next start loads by itself. It prints ``step N`` after each
iteration and saves its final weights to ``final.npz`` (the drill's ``workload.outputs``);
``--step-log DIR`` appends ``<pid> <step> <time>`` per iteration to ``DIR/steps-0.log``.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402
from chainer.training import extensions  # noqa: E402
from step_log import StepLog  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--step-log", type=Path)
    args = parser.parse_args()

    rng = np.random.default_rng(4)
    inputs = rng.standard_normal((400, 8)).astype(np.float32)
    dataset = chainer.datasets.TupleDataset(inputs, (inputs[:, :1] * 2.0).astype(np.float32))
    model = L.Linear(8, 1, initialW=chainer.initializers.Normal(scale=0.1, dtype=np.float32))
    optimizer = chainer.optimizers.SGD(lr=0.05)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(dataset, 8, shuffle=False)
    updater = training.updaters.StandardUpdater(iterator, optimizer, loss_func=lambda x, t: F.mean_squared_error(model(x), t))
    trainer = training.Trainer(updater, (args.steps, "iteration"), out="result")
    trainer.extend(extensions.snapshot(filename="snapshot_iter_{.updater.iteration}", autoload=True),
                   trigger=(args.every, "iteration"))
    steps = StepLog(args.step_log)

    @training.make_extension(trigger=(1, "iteration"))
    def step_line(trainer: training.Trainer) -> None:
        steps.ran(trainer.updater.iteration)

    trainer.extend(step_line)
    trainer.run()
    chainer.serializers.save_npz("final.npz", model)


if __name__ == "__main__":
    main()
