"""Plain PyTorch DDP, drilled through the rank API (the lines marked `# drill`).

Run by a drill (experiments/campaigns/example-torch-ddp.yaml), or by hand with torchrun; the data
of a step is a pure function of (seed, step, rank), so a resumed run draws what an uninterrupted
one drew, and the dropout masks come from each rank's RNG state, saved in every checkpoint.
"""

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from experiments.runtime import api, torch_state  # drill


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    inputs = torch.randn(size, 32, generator=generator)
    return inputs, torch.tanh(inputs[:, :8] * 2.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    rank = api.init(steps=300, checkpoint_every=50, file_format=torch_state.FORMAT)  # drill (by hand: 300 steps)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))  # env://: RANK, WORLD_SIZE, MASTER_*
    torch.manual_seed(rank.seed)  # the same initial weights on every rank
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 8))
    model = DistributedDataParallel(net, find_unused_parameters=True)  # no bucket rebuild: bitwise resume
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    torch.manual_seed(rank.seed * 7_919 + dist.get_rank())  # each rank's own dropout masks

    load = lambda directory, step: torch_state.load(directory, net, optimizer, rank=dist.get_rank())  # drill
    found = rank.resume(load, params=sum(p.numel() for p in net.parameters()))  # drill
    for step in range((found.step if found else 0) + 1, rank.steps + 1):
        inputs, targets = batch(rank.seed, step, dist.get_rank(), args.batch_size)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        rank.step(step, loss.item())  # drill
        warned = rank.preempted(step)  # drill
        if rank.should_checkpoint(step) or warned:  # drill
            with rank.checkpoint(step) as directory:  # drill
                torch_state.save(directory, net, optimizer, rank=dist.get_rank(), step=step)  # drill
        if warned:  # drill
            rank.hold(step)  # drill: saved on the scheduler's warning; the next job resumes here
    rank.done(weights=net.state_dict())  # drill
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
