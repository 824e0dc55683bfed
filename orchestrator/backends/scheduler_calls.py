"""The controller's slow scheduler commands, off its loop: a submission (sbatch, qsub, the look for
a job after a failed try) and the drill's own cancels (scancel, qdel) run on worker threads, and the
loop takes their answers when they are there. A scheduler in a brownout answers in up to a
command's timeout (sbatch 60 s, scancel 3 x 20 s): meanwhile every other run is still watched, its
hangs and deaths detected on time.

Only the scheduler's answer crosses back: the ledger is written on the loop's thread (its sqlite
connection is the loop's), when the loop takes the answer. A backend whose commands cost nothing
(the local one, a test's fake) runs them inline, in order."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
WORKERS = 4  # commands in flight at once: a brownout's sbatch does not hold up every cancel


class SchedulerCalls:
    def __init__(self, off_loop: bool, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scheduler") if off_loop else None

    def start(self, call: Callable[[], T]) -> "Future[T]":
        """``call`` on a worker (or now, inline): its answer, or the exception it raised, in the future.
        Inline, an exception that ends the process (BaseException: an interrupt, a test's crash)
        goes on up at once, as it would from the loop."""
        if self._pool is not None:
            return self._pool.submit(call)
        done: Future[T] = Future()
        try:
            done.set_result(call())
        except Exception as error:
            done.set_exception(error)
        return done

    def close(self) -> None:
        """Commands in flight are waited for (their scheduler answers within their timeouts); an
        answer no loop took is found again by the next controller (a submission is looked up)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
