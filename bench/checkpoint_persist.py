"""Checkpoint persist cost against the floor of this disk, measured in the same run.

For each size: the floor is writing the same number of bytes with one write and fsync (what any
durable checkpoint must pay here); the measured path is the real one, torch.save of model and Adam
state through Faultdrill's checkpoint store (temporary names, fsync, sha256 manifest, atomic rename).
Prints the ratio measured/floor (1.0 = as fast as the disk allows) and the bytes over raw parameters.

    .venv/bin/python bench/checkpoint_persist.py [--params 1000000 10000000] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore

META = CheckpointMeta(framework="torch", format="torch.save", writers="rank0")


def _state(params: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(params, generator=generator) for name in ("weights", "adam_m", "adam_v")}


def floor_write_s(directory: Path, size: int) -> float:
    payload = os.urandom(size)
    path = directory / "floor.bin"
    start = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.monotonic() - start
    path.unlink()
    return elapsed


def store_write_s(run_dir: Path, step: int, state: dict[str, torch.Tensor]) -> tuple[float, int]:
    store = CheckpointStore(run_dir, keep=1)
    start = time.monotonic()
    sink = store.sink(step)
    with sink.open("model.pt") as handle:
        torch.save(state, handle)
    sink.close()
    record = store.commit(step, attempt=0, meta=META, started=start, blocking_s=None)
    return time.monotonic() - start, record.bytes


def bench(params: int, repeats: int, directory: Path) -> None:
    state = _state(params)
    store_times, floor_times, size = [], [], 0
    for step in range(1, repeats + 1):
        elapsed, size = store_write_s(directory / f"run-{params}", step, state)
        store_times.append(elapsed)
        floor_times.append(floor_write_s(directory, size))
    store_s, floor_s = statistics.median(store_times), statistics.median(floor_times)
    raw = 3 * params * 4
    print(f"params={params:>11,d}  bytes={size:>12,d} ({size / raw:.4f} x raw state)  "
          f"floor={floor_s * 1e3:8.1f} ms ({size / floor_s / 2**20:6.0f} MiB/s)  "
          f"store={store_s * 1e3:8.1f} ms  ratio={store_s / floor_s:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a folder in /var/tmp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="fd-bench-") as scratch:
        for params in args.params:
            bench(params, args.repeats, Path(scratch))


if __name__ == "__main__":
    main()
