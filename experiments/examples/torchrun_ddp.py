"""Plain PyTorch DDP under torchrun, knowing nothing of Faultdrill (zero-code): the imagenet
example's idiom, ``torch.save`` every ``--every`` steps into ``checkpoint.pt`` in the working
directory and a load of it whenever it is there. Launched as its user launches it::

    torchrun --nproc-per-node=2 torchrun_ddp.py --steps 300

and drilled the same way (experiments/campaigns/example-torchrun*.yaml: the command starts with
torchrun, so the ranks are its workers). Rank 0 prints ``step N`` (the drill's progress, read from
the log); ``--step-log DIR`` makes every rank also append ``<pid> <step> <time>`` to
``DIR/steps-<rank>.log`` for each step it ran: what really happened, to hold the drill's report against.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from step_log import StepLog
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT = Path("checkpoint.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--step-s", type=float, default=0.03, help="least time a step takes")
    parser.add_argument("--step-log", type=Path)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if CHECKPOINT.exists():
        state = torch.load(CHECKPOINT)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    steps = StepLog(args.step_log, rank)
    for step in range(start + 1, args.steps + 1):
        began = time.monotonic()
        inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 31 + rank))
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        time.sleep(max(0.0, args.step_s - (time.monotonic() - began)))
        steps.ran(step, announce=rank == 0, pace_s=0.0)
        if rank == 0:
            if step % args.every == 0:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(state, "checkpoint.tmp")
                os.replace("checkpoint.tmp", CHECKPOINT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
