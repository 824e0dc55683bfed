"""One rank's bookkeeping of one attempt: what a drill measures, for any training loop.

The built-in runner (``experiments/runner.py``) and a user's script through the rank API
(``experiments/runtime/api.py``) both go through ``RankSession``: the attempt's timeline (events),
the resume from the newest valid checkpoint agreed by all ranks, the checkpoint cadence and its
two-phase write through the store, heartbeats, the loss log, the warning agreed at one step, the
attempt fence and the final record. The only thing it needs from the training side is a way for
the ranks to meet (``Collectives``): the framework's own collectives in the runner, files in the
attempt's directory for a script that brings its own process group.
"""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn, Protocol

from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_FRAMEWORK_READY,
    EVENT_PROCESS_START,
    EVENT_WARNED,
    CheckpointRecord,
    FinalRecord,
    LossRecord,
    RankJob,
    RunPaths,
    append_json_line,
    record_dict,
    write_json_atomic,
)
from experiments.runtime.checkpoint import CheckpointMeta, CheckpointStore, ValidCheckpoint, explain_write_failure
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.events import EventLog
from experiments.runtime.fence import check_current, own_job_id
from experiments.runtime.heartbeat import HeartbeatWriter
from experiments.runtime.identity import created_at
from experiments.runtime.persist import PersistWorker
from experiments.runtime.sink import FileSink
from experiments.runtime.snapshot import Snapshot
from experiments.runtime.warning import EXIT_WARNED, WARNING_POLL_STEPS, WarningNote, wait_for_the_end

if TYPE_CHECKING:  # numpy only where weights are kept: the rank API itself needs nothing but Python
    import numpy as np


class Collectives(Protocol):
    """How the ranks of one attempt meet: every rank calls these in the same order."""

    def barrier(self, timeout_s: float | None = None) -> None:
        """Wait for every rank; ``timeout_s`` None: the collective timeout."""

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        """Rank 0's ``value`` on every rank."""


@dataclass(frozen=True)
class SessionOptions:
    timeouts: Timeouts = field(default_factory=Timeouts)
    # True: training waits only for a snapshot of the state; a thread writes it, makes it durable
    # and (rank 0) publishes it while training goes on.
    async_persist: bool = True
    # The scheduler's warning (installed by the entry point); None: a warning is not watched.
    warning: WarningNote | None = None
    warning_hold_s: float = 300.0


class RankSession:
    def __init__(self, job: RankJob, env: DistEnv, collectives: Collectives, meta: CheckpointMeta,
                 options: SessionOptions, started_at: float) -> None:
        self.job, self.env, self.collectives, self.meta, self.options = job, env, collectives, meta, options
        self.started_at = started_at
        self.paths = RunPaths(Path(job.run_dir))
        self.store = CheckpointStore(self.paths.root, job.checkpoint_keep)
        self.events = EventLog(self.paths.events_file(job.attempt), enabled=env.is_main)
        self.heartbeat = HeartbeatWriter(self.paths.heartbeat_file(job.attempt, env.rank), job.attempt,
                                         job.heartbeat_interval_s, fault_steps=job.fault_steps)
        self.persist = PersistWorker()
        self.job_id = own_job_id(env.job_id)
        self.start_step = 0
        self.train_time_s = 0.0  # time inside the training steps of this attempt: the study's step time
        self.steps_trained = 0

    @property
    def checkpoint_s(self) -> float:
        return self.options.timeouts.checkpoint_s

    # --- start ------------------------------------------------------------------------------------

    def started(self) -> None:
        """The process runs (rank 0 notes it); rank 0 clears what a dead attempt left half-written."""
        env = self.env
        self.events.emit(
            EVENT_PROCESS_START, when=self.started_at, pid=os.getpid(),
            create_time=created_at(os.getpid()), world_size=env.world_size,
            num_nodes=env.num_nodes, scheduler=env.scheduler, job_id=env.job_id, node=env.node,
        )
        self.clear_stale()

    def clear_stale(self) -> None:
        if self.env.is_main:
            # Before the ranks meet: no other rank can write a checkpoint until rank 0 has joined.
            self.store.remove_stale()

    def ready(self, determinism: str = "", **timings: float) -> None:
        """The framework is set up (process group, model): the end of the start-up phase."""
        self.events.emit(EVENT_FRAMEWORK_READY, since_start_s=time.time() - self.started_at,
                         determinism=determinism, **timings)

    # --- resume -----------------------------------------------------------------------------------

    def resume(self, load: Callable[[Path, int], None] | None) -> ValidCheckpoint | None:
        """Agree on the newest valid checkpoint (rank 0 verifies, all load with ``load``); None: a
        cold start. A checkpoint a rank cannot load is kept out of the next choice and re-raised."""
        started = time.monotonic()
        found, verify_s, skipped = None, 0.0, []
        with self.heartbeat.phase("resume", self.checkpoint_s, step=0):
            if self.env.is_main:
                found = self.store.newest_valid()
                verify_s = time.monotonic() - started
                # Newer checkpoints that could not be used: the fallback's extra lost work.
                skipped = [step for step, _ in self.store.set_aside_newer_than(found.step if found else 0)]
            # The others wait while rank 0 hashes: a checkpoint's time, not a collective's.
            step = self.collectives.broadcast_int(found.step if found else 0, self.checkpoint_s)
            if step > 0 and (found is None or found.step != step):
                found = self.store.agreed(step)
            if found is not None and load is not None:
                self._load(load, found)
        self.start_step = found.step if found else 0
        self.events.emit(EVENT_CHECKPOINT_LOADED, step=self.start_step, load_s=time.monotonic() - started,
                         verify_s=verify_s, skipped=skipped)
        self.heartbeat.beat(self.start_step, force=True)
        return found

    def took_state(self, step: int, load_s: float, source_rank: int) -> None:
        """The state came from a peer, not a checkpoint (restart.strategy warm): the resume step is
        the one the group's plan named."""
        self.start_step = step
        self.events.emit(EVENT_CHECKPOINT_LOADED, step=step, load_s=load_s, source=f"rank {source_rank}")
        self.heartbeat.beat(step, force=True)

    def _load(self, load: Callable[[Path, int], None], found: ValidCheckpoint) -> None:
        try:
            load(found.path, found.step)
        except Exception as error:
            self.store.reject(found.step, self.env.rank, self.job.attempt, f"{type(error).__name__}: {error}")
            raise

    # --- training -----------------------------------------------------------------------------------

    def checkpoint_due(self, step: int) -> bool:
        every = self.job.checkpoint_every
        return every > 0 and step % every == 0

    def stepped(self, step: int, loss: float | None = None, step_s: float | None = None) -> None:
        """Step ``step`` is done: loss log, first-step event, heartbeat (always before a checkpoint
        and at the last step, so lost work is exact there)."""
        if step_s is not None:
            self.train_time_s += step_s
        self.steps_trained += 1
        self.persist.check()  # a checkpoint that failed in the background fails the rank now
        if self.env.is_main and loss is not None:
            append_json_line(self.paths.loss_log, asdict(LossRecord(self.job.attempt, step, loss)))
        if self.steps_trained == 1:
            self.events.emit(EVENT_FIRST_STEP, step=step)
        self.heartbeat.beat(step, force=self.checkpoint_due(step) or step == self.job.workload.steps)

    @contextmanager
    def phase(self, name: str, step: int, timeout_s: float | None = None) -> Iterator[None]:
        with self.heartbeat.phase(name, timeout_s or self.checkpoint_s, step):
            yield

    def checkpoint(self, step: int, snapshot: Snapshot) -> None:
        """Every rank captures its share (``snapshot``), it is written and made durable, and rank 0
        publishes once every rank delivered. Asynchronous: training waits for the capture alone."""
        if self.options.async_persist:
            self._checkpoint_in_background(step, snapshot)
            return
        with self.writing(step) as sink:
            snapshot(sink)()

    def _checkpoint_in_background(self, step: int, snapshot: Snapshot) -> None:
        with self.phase("checkpoint", step):
            started = time.monotonic()
            self.persist.wait()  # this rank's previous share written (rank 0: published): in step order
            sink = self.store.sink(step, self.env.rank)
            write = snapshot(sink)
            blocking_s = time.monotonic() - started
        self.persist.submit(functools.partial(self._persist_share, step, sink, write, started, blocking_s))

    def _persist_share(self, step: int, sink: FileSink, write: Callable[[], None], started: float,
                       blocking_s: float) -> CheckpointRecord | None:
        """On the persist thread: this rank's share to disk; rank 0 then waits for every rank's
        receipt (instead of a barrier on the training path) and publishes."""
        try:
            write()
            sink.close()
        except Exception as error:
            raise explain_write_failure(error, self.store.root, step) from error
        if not self.env.is_main:
            return None
        self.store.await_receipts(step, self.env.world_size, self.checkpoint_s)
        return self.store.commit(step, self.job.attempt, self.meta, started, blocking_s, ranks=self.env.world_size,
                                 before_publish=self._check_fence)

    @contextmanager
    def writing(self, step: int) -> Iterator[FileSink]:
        """The sink for this rank's share of checkpoint ``step``; when the block ends, the share
        is made durable, the ranks meet and rank 0 publishes (nothing if the block raised)."""
        with self.phase("checkpoint", step):
            started = time.monotonic()
            if self.env.is_main:
                self.persist.wait()  # publish in step order; never two commits in flight
            sink = self.store.sink(step, self.env.rank)
            try:
                yield sink
                sink.close()
            except Exception as error:
                raise explain_write_failure(error, self.store.root, step) from error
            self._publish(step, started)

    def _publish(self, step: int, started: float) -> None:
        """Every rank wrote its share (the rank API's checkpoint block): rank 0 publishes, on the
        persist thread when persist is asynchronous."""
        self.collectives.barrier(self.checkpoint_s)
        asynchronous = self.options.async_persist
        # Synchronous: training waits for the whole commit, so blocking time is persist time.
        blocking_s = time.monotonic() - started if asynchronous else None
        if self.env.is_main:
            commit = functools.partial(
                self.store.commit, step, self.job.attempt, self.meta, started, blocking_s,
                ranks=self.env.world_size, before_publish=self._check_fence,
            )
            if asynchronous:
                self.persist.submit(commit)
            else:
                self.persist.records.append(commit())
        if not asynchronous:
            self.collectives.barrier(self.checkpoint_s)

    def _check_fence(self, doing: str = "publishing a checkpoint") -> None:
        check_current(self.paths, self.job.attempt, self.job_id, doing, drill_id=self.job.drill_id or None)

    # --- the scheduler's warning ----------------------------------------------------------------------

    @property
    def warned(self) -> bool:
        """This rank has received the warning (its own; use ``warning_agreed`` to stop together)."""
        return self.options.warning is not None and self.options.warning.received

    def warning_agreed(self, step: int) -> bool:
        """Rank 0's warning, seen by every rank at the same step (so that all save that step)."""
        note = self.options.warning
        if note is None:
            return False
        if self.env.world_size == 1:
            return note.received
        if step % WARNING_POLL_STEPS:
            return False
        return self.collectives.broadcast_int(int(note.received)) == 1

    def checkpoint_on_warning(self, step: int, snapshot: Snapshot | None) -> None:
        """Save ``step`` (``snapshot`` None: it was just saved) and make it durable, then note it."""
        note = self.options.warning
        assert note is not None
        started = time.monotonic()
        if snapshot is not None:
            self.checkpoint(step, snapshot)
        with self.phase("checkpoint", step):
            self.persist.wait()  # durable before the scheduler may end the job
        self.events.emit(EVENT_WARNED, step=step, signal=note.signal.name, received_at=note.received_at,
                         checkpoint_s=time.monotonic() - started)

    def hold(self, step: int) -> NoReturn:
        """Train no more: wait for the scheduler to end the job; if it never does, exit EXIT_WARNED."""
        hold_s = self.options.warning_hold_s
        with self.phase("warned", step, hold_s + 60.0):
            wait_for_the_end(hold_s)
        raise SystemExit(EXIT_WARNED)

    # --- the end ------------------------------------------------------------------------------------

    def finish(self, final_step: int, digest: Callable[[], str],
               named_weights: Callable[[], list[tuple[str, np.ndarray]]] | None) -> str:
        """Every rank reached ``final_step``: the last checkpoint durable, rank 0 writes the final
        record (and the weights, when the run keeps them). Returns the digest."""
        with self.phase("finish", final_step):
            self.persist.wait()
            # Every rank reached the end before rank 0 declares the run complete.
            self.collectives.barrier(self.checkpoint_s)
            value = digest()
            if self.env.is_main:
                self._write_final(final_step, value, named_weights)
        return value

    def _write_final(self, final_step: int, digest: str,
                     named_weights: Callable[[], list[tuple[str, np.ndarray]]] | None) -> None:
        self._check_fence("writing the final record")
        if self.job.keep_final_weights and named_weights is not None:
            save_weights(self.paths.final_weights, named_weights())
        record = FinalRecord(step=final_step, digest=digest, time=time.time(), attempt=self.job.attempt,
                             drill_id=self.job.drill_id)
        write_json_atomic(self.paths.final, record_dict(record))
        step_time_s = self.train_time_s / self.steps_trained if self.steps_trained and self.train_time_s else 0.0
        self.events.emit(EVENT_COMPLETED, step=final_step, digest=digest, step_time_s=step_time_s)


def save_weights(path: Path, named: list[tuple[str, np.ndarray]]) -> None:
    """Named arrays to ``path`` atomically (temporary name, fsync, rename)."""
    import numpy as np  # only a run that keeps its final weights needs it
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.savez(handle, **dict(named))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
