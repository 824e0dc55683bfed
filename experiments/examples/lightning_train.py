"""A Lightning Trainer drilled by the callback (the four lines marked `# drill`).

A small transformer encoder (torch.nn.TransformerEncoder, random weights) classifies synthetic
token sequences; the data of an epoch is a pure function of the seed, so a resumed run sees what
an uninterrupted one saw. Nothing is downloaded.
"""

import argparse

import lightning
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from experiments.runtime.lightning_callback import FaultdrillCallback  # drill

VOCAB, LENGTH, CLASSES = 64, 16, 4


class Classifier(lightning.LightningModule):
    def __init__(self, width: int, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens, labels = batch
        return nn.functional.cross_entropy(self(tokens), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def dataset(seed: int, samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (samples, LENGTH), generator=generator)
    return TensorDataset(tokens, tokens[:, 0] % CLASSES)  # the first token decides the class


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()

    drill = FaultdrillCallback(steps=200, checkpoint_every=20)  # drill (by hand: 200 steps)
    lightning.seed_everything(drill.rank.seed, workers=True)
    torch.use_deterministic_algorithms(True)
    # 20 batches an epoch per rank: every checkpoint falls at an epoch's end, where Lightning resumes exactly
    # (no shuffle: a RandomSampler's generator is not in Lightning's checkpoint; under DDP, Lightning's
    # DistributedSampler is seeded per epoch).
    loader = DataLoader(dataset(drill.rank.seed, 20 * 8 * args.devices * args.nodes), batch_size=8)
    trainer = lightning.Trainer(
        accelerator="cpu", devices=args.devices, num_nodes=args.nodes, strategy="ddp" if args.devices * args.nodes > 1
        else "auto", max_steps=drill.steps, callbacks=[drill],  # drill
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(Classifier(args.width, args.lr), loader, ckpt_path=drill.ckpt_path)  # drill


if __name__ == "__main__":
    main()
