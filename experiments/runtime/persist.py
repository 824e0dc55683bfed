"""A checkpoint's persist off the training path, on a worker thread: a rank's share written and
made durable from the snapshot it took (and on rank 0, once every rank delivered, the manifest and
the rename that publishes).

At most one job is in flight: the next checkpoint (and the end of the run) waits for the previous
one, so checkpoints are published in step order; a failure surfaces at the next step (``check``).
"""

from __future__ import annotations

import threading
from typing import Callable

from experiments.layout import CheckpointRecord

PersistJob = Callable[[], "CheckpointRecord | None"]  # None: a share written, nothing published here


class PersistWorker:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.records: list[CheckpointRecord] = []

    def submit(self, commit: PersistJob) -> None:
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
            raise RuntimeError(f"publishing a checkpoint failed: {error}") from error

    def check(self) -> None:
        """Re-raise the error of a job that has already ended (never waits for one in flight)."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def _run(self, commit: PersistJob) -> None:
        try:
            record = commit()
        except BaseException as error:  # handed to the training thread by wait() or check()
            self._error = error
            return
        if record is not None:
            self.records.append(record)
