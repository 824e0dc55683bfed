"""Many small pieces of file work side by side where that pays: a sweep's arrays write a fence and
a pickled call for each of thousands of runs, each a few metadata operations (create, rename) that
wait on the filesystem, on a network filesystem a round trip to its server each. On threads those
waits overlap; on a local disk they are shorter than the threads' own cost (the interpreter's lock,
a future for each item), and one after another is faster. So the first items go one after another,
timed: where they waited on the filesystem more than they computed, the rest go on threads. The
work itself takes no lock of the caller's."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 8
LEAST = 32  # fewer items than this: one after the other (a pool costs more than it saves)
PROBE = 16  # the items done one after another first, to see where their time goes
# Threads for the rest where the probe's wall time was more than this many times its CPU time: it
# waited on the filesystem (the threads' cost is about the item's CPU time again).
WAITING_RATIO = 3.0


def at_once(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``work`` of every item, in the items' order; the first exception raised is raised here,
    once every item's work has ended (of the probe's: at once, nothing after it started)."""
    if len(items) < LEAST:
        return [work(item) for item in items]
    wall, cpu = time.perf_counter(), time.thread_time()
    done = [work(item) for item in items[:PROBE]]
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    rest = items[PROBE:]
    if not waits_on_the_filesystem(wall, cpu):
        return done + [work(item) for item in rest]
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="files") as pool:
        return done + list(pool.map(work, rest))


def waits_on_the_filesystem(wall_s: float, cpu_s: float) -> bool:
    """Whether work that took ``wall_s`` and ``cpu_s`` of this thread's CPU mostly waited."""
    return wall_s > WAITING_RATIO * max(cpu_s, 1e-6)
