"""A Lightning Trainer that knows nothing of Faultdrill (zero-code): ``ModelCheckpoint(
every_n_train_steps=N, save_last=True)`` into ``ckpt/`` of its working directory and
``fit(ckpt_path="last")``, the resume Lightning's documentation gives. It prints ``step N`` after
each batch (N: the trainer's global step) and saves its final weights to ``final.pt`` (the drill's
``workload.outputs``); ``--step-log DIR`` appends ``<pid> <step> <time>`` per batch to
``DIR/steps-0.log``: what really ran.
"""

import argparse
from pathlib import Path

import lightning
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from step_log import StepLog
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class StepLines(Callback):
    def __init__(self, log: Path | None) -> None:
        self.steps = StepLog(log)

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: object) -> None:
        self.steps.ran(trainer.global_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--step-log", type=Path)
    args = parser.parse_args()

    lightning.seed_everything(3)
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(50 * 8, 8, generator=generator)
    loader = DataLoader(TensorDataset(inputs, inputs[:, :1] * 2.0), batch_size=8)  # 50 batches an epoch
    checkpoint = ModelCheckpoint(dirpath="ckpt", every_n_train_steps=args.every, save_last=True, save_top_k=0)
    trainer = lightning.Trainer(max_steps=args.steps, callbacks=[checkpoint, StepLines(args.step_log)],
                                accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                                enable_model_summary=False)
    model = Regressor()
    trainer.fit(model, loader, ckpt_path="last" if Path("ckpt/last.ckpt").exists() else None)
    torch.save(model.state_dict(), "final.pt")


if __name__ == "__main__":
    main()
