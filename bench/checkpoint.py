"""Durable checkpoint throughput per framework against the disk's floor, in the same run (issue 11).

For each framework and state size (weights + Adam moments: 12 bytes a parameter; 16 MB to >= 1 GB)
a one-rank workload of that size trains one step, then saves through Faultdrill's store exactly
as a rank does (the workload's ``save`` into the store's sink: temporary names, fsync, rename,
receipt; then rank 0's commit: the manifest of the files' hashes, publish):
- ``sync``: training waits for the whole save (the store's ``blocking_s`` = ``persist_s``);
- ``async``: training waits for the workload's snapshot (a copy of the state in memory); the write,
  fsync (the hash taken meanwhile), receipt and commit run on the persist thread; ``blocking`` is
  what training waited, ``persist`` until published.
The floor: the smallest crash-consistent publish of the same number of bytes in the same directory
(write, fsync, rename, directory fsync: what any correct store must do), measured next to each
save; and the same with the writeback hint the store gives (the floor of a writer that knows it). Prints the ratios (1.00 = as fast as the disk allows); writes JSON. ``--hash sha256`` hashes
as a store without the blake3 package does (the lever of issue 24, measured in one run each).

Goals (issue 24): sync <= 1.25 x floor for every framework at 16 MiB, 128 MiB and 1 GiB; async
blocking <= 10 % of sync.

    .venv/bin/python bench/checkpoint.py [--frameworks torch,tensorflow,chainer] [--mb 16 128 1024]
                                         [--repeats 3] [--hash blake3|sha256] [--dir DIR]
                                         [--out bench/results/checkpoint.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.layout import WorkloadSpec, fsync_dir  # noqa: E402
from experiments.runtime import integrity  # noqa: E402
from experiments.runtime.checkpoint import CheckpointStore  # noqa: E402
from experiments.runtime.distenv import DistEnv, Timeouts  # noqa: E402
from experiments.runtime.persist import PersistWorker  # noqa: E402
from experiments.runtime.sink import WritebackFile  # noqa: E402
from experiments.runtime.writeback import start_writeback  # noqa: E402
from experiments.workloads import get_workload  # noqa: E402

BYTES_PER_PARAM = 12  # float32 weights + Adam's two moments
FLOOR_CHUNK = 4 << 20


def floor_s(directory: Path, size: int, writeback_hint: bool = False) -> float:
    """The smallest crash-consistent publish of ``size`` bytes: write them under a temporary name,
    fsync, rename to the final name, fsync the directory (what any correct checkpoint store pays).
    ``writeback_hint``: the disk told to start writing every 2 MiB as they go out, as the store
    does (experiments/runtime/writeback.py): the floor of a writer that knows the trick too."""
    payload = os.urandom(size)
    temporary, final = directory / ".floor.bin.tmp", directory / "floor.bin"
    chunk = WritebackFile.WRITEBACK_BYTES if writeback_hint else FLOOR_CHUNK
    started = time.monotonic()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view, written = memoryview(payload), 0
        while view:  # in chunks, as any writer of a large state does (one 1 GiB write() is slower here)
            count = os.write(fd, view[:chunk])
            if writeback_hint:
                start_writeback(fd, written, count)
            view, written = view[count:], written + count
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, final)
    fsync_dir(directory)
    elapsed = time.monotonic() - started
    final.unlink()
    return elapsed


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def save_once(workload: Any, store: CheckpointStore, step: int, asynchronous: bool,
              worker: PersistWorker) -> tuple[float, float, int]:
    """(blocking s, persist s, bytes) of one checkpoint through the store, as a rank's session takes
    it (experiments/runtime/session.py): the workload's snapshot, then its write, the sink's receipt
    and rank 0's commit — on the persist thread when asynchronous (training waits for the snapshot)."""
    started = time.monotonic()
    sink = store.sink(step)
    # as the runner does (experiments/runner.py): a synchronous save writes the state as it stands
    write = workload.snapshot(sink, step) if asynchronous else functools.partial(workload.save, sink, step)
    meta = workload.checkpoint_meta

    def persist(blocking_s: float | None) -> Any:
        write()
        sink.close()
        return store.commit(step, attempt=0, meta=meta, started=started, blocking_s=blocking_s)

    if asynchronous:
        worker.submit(lambda: persist(time.monotonic() - started))
        worker.wait()
        record = worker.records[-1]
    else:
        record = persist(None)
    published_s = time.monotonic() - started  # the bench's own clock, to the publish (the manifest included)
    return (record.blocking_s if asynchronous else published_s), published_s, record.bytes


def bench_one(framework: str, mb: int, repeats: int, directory: Path, hash_algorithm: str) -> list[dict[str, Any]]:
    """One framework, one size, sync and async, in this process (``main`` gives each its own)."""
    if hash_algorithm == integrity.SHA256:  # as a store without the blake3 package hashes
        integrity._blake3 = lambda: None  # the bench's lever, in its own process
    assert integrity.default_algorithm() == hash_algorithm, f"{hash_algorithm} is not available here"
    params = mb * 2**20 // BYTES_PER_PARAM
    workload = get_workload(framework)
    env = DistEnv.from_environ({"FAULTDRILL_MASTER_PORT": str(_free_port())}, hostname="bench")
    workload.setup(env, WorkloadSpec(framework=framework, params=params, steps=repeats * 2, batch_size=8), Timeouts())
    rows = []
    try:
        workload.train_step(1)  # the optimizer's state exists from the first step on
        for asynchronous in (False, True):
            mode = "async" if asynchronous else "sync"
            store, worker = CheckpointStore(directory / f"{framework}-{mb}-{mode}", keep=1), PersistWorker()
            samples = []
            for step in range(1, repeats + 1):
                os.sync()  # each measurement from a clean write-back state: none pays for another's pages
                blocking, persist, size = save_once(workload, store, step, asynchronous, worker)
                store.wait_pruned()  # the old checkpoint's deletion (the store's background) is not the floor's
                os.sync()
                floor = floor_s(directory, size)
                os.sync()
                samples.append((blocking, persist, size, floor, floor_s(directory, size, writeback_hint=True)))
            blocking, persist, floor, hinted = (statistics.median(sample[i] for sample in samples) for i in (0, 1, 3, 4))
            rows.append({"framework": framework, "state_mb": mb, "params": params, "mode": mode, "hash": hash_algorithm,
                         "bytes": samples[-1][2], "blocking_s": blocking, "persist_s": persist, "floor_s": floor,
                         "persist_x_floor": persist / floor, "blocking_x_floor": blocking / floor,
                         "hinted_floor_s": hinted, "persist_x_hinted_floor": persist / hinted})
    finally:
        workload.shutdown()
    return rows


def _in_subprocess(framework: str, mb: int, repeats: int, directory: Path, hash_algorithm: str) -> list[dict[str, Any]]:
    """A fresh process per framework and size: a framework's runtime is set up once per process."""
    done = subprocess.run([sys.executable, __file__, "--one", framework, str(mb), "--repeats", str(repeats),
                           "--dir", str(directory), "--hash", hash_algorithm], capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"bench: {framework} at {mb} MiB failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default="torch,tensorflow,chainer")
    parser.add_argument("--mb", type=int, nargs="+", default=[16, 128, 1024], help="state sizes, MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hash", choices=integrity.ALGORITHMS, default=integrity.BLAKE3,
                        help="the checkpoint files' hash (sha256: as a store without the blake3 package)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a folder in /var/tmp)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "checkpoint.json")
    parser.add_argument("--one", nargs=2, metavar=("FRAMEWORK", "MIB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # What a Chainer rank's environment says (experiments/workloads/__init__.py): chainer imports numpy.distutils.
    os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")
    if args.one:
        print(json.dumps(bench_one(args.one[0], int(args.one[1]), args.repeats, args.dir, args.hash)))
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="fd-bench-ckpt-") as scratch:
        for framework in args.frameworks.split(","):
            for mb in args.mb:
                measured = _in_subprocess(framework, mb, args.repeats, Path(scratch), args.hash)
                for row in measured:  # as it goes: a long run shows its progress
                    print(f"  {framework} {mb} MiB {row['mode']}: persist {row['persist_x_floor']:.2f} x floor, "
                          f"{row['persist_x_hinted_floor']:.2f} x the hinted floor, blocking {row['blocking_s']:.3f} s",
                          file=sys.stderr, flush=True)
                rows.extend(measured)
    sync = {(r["framework"], r["state_mb"]): r for r in rows if r["mode"] == "sync"}
    print("framework | state MiB | mode | bytes | floor s | hinted floor s | blocking s | persist s | persist x floor | "
          "persist x hinted floor | async blocking / sync")
    for row in rows:
        share = row["blocking_s"] / sync[(row["framework"], row["state_mb"])]["persist_s"] if row["mode"] == "async" else None
        row["blocking_share_of_sync"] = share
        print(f"{row['framework']} | {row['state_mb']} | {row['mode']} | {row['bytes']:,} | {row['floor_s']:.3f} | "
              f"{row['hinted_floor_s']:.3f} | {row['blocking_s']:.3f} | {row['persist_s']:.3f} | "
              f"{row['persist_x_floor']:.2f} | {row['persist_x_hinted_floor']:.2f} | "
              + ("-" if share is None else f"{share:.0%}"))
    print(f"medians; hash {args.hash}; floor: write, fsync, rename, directory fsync of the same bytes in the same "
          "directory, next to each save")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}, indent=2))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
