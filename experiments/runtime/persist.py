"""Publishing a checkpoint off the training path (hash, manifest, rename) on a worker thread.

Hashing reads every byte back; for large checkpoints that is the bulk of persist time, and the
ranks need not wait for it: their files are already durable when the barrier passes. At most one
commit is in flight: the next checkpoint (and the end of the run) waits for the previous one, so
checkpoints are published in step order and an error surfaces within one checkpoint interval.
"""

from __future__ import annotations

import threading
from typing import Callable

from experiments.layout import CheckpointRecord


class PersistWorker:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.records: list[CheckpointRecord] = []

    def submit(self, commit: Callable[[], CheckpointRecord]) -> None:
        self.wait()
        # Not a daemon: if training fails meanwhile, the interpreter still finishes publishing a
        # checkpoint whose files are all written, rather than leave it as a partial directory.
        self._thread = threading.Thread(target=self._run, args=(commit,), name="checkpoint-persist")
        self._thread.start()

    def wait(self) -> None:
        """Block until the commit in flight is published; re-raise its error here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("publishing a checkpoint failed") from error

    def _run(self, commit: Callable[[], CheckpointRecord]) -> None:
        try:
            self.records.append(commit())
        except BaseException as error:  # handed to the training thread by wait()
            self._error = error
