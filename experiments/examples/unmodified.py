"""A training script that knows nothing of Faultdrill: zero-code mode.

It logs `step N loss X`, saves its own checkpoint every --save-every steps into --ckpt-dir
(ckpt-<step>.pt: model, optimizer, RNG state) and, with --resume, continues from the newest one.
Drilled by experiments/campaigns/example-unmodified.yaml, which reads its progress from the log
lines and gives --resume on a restart. It uses torch.distributed if started with WORLD_SIZE > 1.
"""

import argparse
import os
import re
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def newest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("ckpt-*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[-1]))
    return found[-1] if found else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--ckpt-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    latest = newest_checkpoint(args.ckpt_dir) if args.resume else None
    if latest is not None:
        state = torch.load(latest, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
        print(f"resumed from {latest} at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        inputs = torch.randn(8, 16)
        loss = nn.functional.mse_loss(model(inputs), inputs[:, :4])
        optimizer.zero_grad()
        loss.backward()
        if distributed:
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad /= dist.get_world_size()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if rank == 0 and step % args.save_every == 0:
            args.ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = args.ckpt_dir / f".ckpt-{step}.pt.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng": torch.get_rng_state(), "step": step}, tmp)
            os.replace(tmp, args.ckpt_dir / f"ckpt-{step}.pt")
    if distributed:
        dist.barrier()  # rank 0 may still be saving: a peer that tears gloo down meanwhile aborts
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
