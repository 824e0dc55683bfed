"""An MPI program that knows nothing of Faultdrill (zero-code mode, `launcher: mpi`).

MPI (mpi4py) gives it its rank and world: the drill starts it under mpiexec on the local backend
and PBS, under `srun --mpi=pmix` on Slurm. Every step all ranks sum a number (an allreduce: a dead
peer ends the launch); it logs `step N total T`, rank 0 saves the running total every --save-every
steps into --ckpt-dir (step-<N>.npy, written under a temporary name, then renamed) and, with
--resume, continues from the newest one. Drilled by experiments/campaigns/example-mpi.yaml.
"""

import argparse
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI


def newest(directory: Path) -> tuple[int, np.ndarray] | None:
    saved = sorted(directory.glob("step-*.npy"), key=lambda path: int(path.stem.split("-")[1]))
    return (int(saved[-1].stem.split("-")[1]), np.load(saved[-1])) if saved else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--ckpt-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    library = MPI.Get_library_version().split(",")[0].strip()  # "Open MPI v5.0.11": the venv's, or the site's
    print(f"mpi rank {rank} of {size} ({library})", flush=True)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    start, total = 0, np.zeros(1)
    found = newest(args.ckpt_dir) if args.resume else None
    if found is not None:
        start, total = found
        print(f"resumed at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        total = total + comm.allreduce(float(step * (rank + 1)))
        time.sleep(0.01)  # the work of a step
        print(f"step {step} total {total[0]:.0f}", flush=True)
        if step % args.save_every == 0 and rank == 0:
            tmp = args.ckpt_dir / f".step-{step}.npy"
            np.save(tmp, total)
            tmp.rename(args.ckpt_dir / f"step-{step}.npy")
    comm.Barrier()


if __name__ == "__main__":
    main()
