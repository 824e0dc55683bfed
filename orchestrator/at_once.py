"""Many small pieces of file work side by side: a sweep's arrays write a fence and a pickled call
for each of thousands of runs, each a few metadata operations (create, rename) that wait on the
filesystem, on a network filesystem a round trip to its server each. On threads they overlap; the
work itself takes no lock of the caller's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 8
LEAST = 32  # fewer items than this: one after the other (a pool costs more than it saves)


def at_once(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``work`` of every item, in the items' order; the first exception raised is raised here,
    once every item's work has ended."""
    if len(items) < LEAST:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="files") as pool:
        return list(pool.map(work, items))
