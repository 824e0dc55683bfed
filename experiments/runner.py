"""The framework-agnostic training loop: everything a drill measures, for any ``Workload``.

The runner owns the attempt's timeline (events), resume from the newest valid checkpoint, the
checkpoint cadence and its two-phase write, heartbeats, the loss log, the final digest and the
barriers that keep ranks in step. A workload only trains, saves, loads and digests.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_FRAMEWORK_READY,
    EVENT_PROCESS_START,
    EVENT_WARNED,
    FinalRecord,
    RankJob,
    RunPaths,
    append_json_line,
    record_dict,
    write_json_atomic,
)
from experiments.runtime.checkpoint import CheckpointStore, explain_write_failure
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.events import EventLog
from experiments.runtime.fence import check_current, own_job_id
from experiments.runtime.heartbeat import HeartbeatWriter
from experiments.runtime.persist import PersistWorker
from experiments.runtime.warning import EXIT_WARNED, WARNING_POLL_STEPS, WarningNote, wait_for_the_end
from experiments.workloads.base import Workload


@dataclass(frozen=True)
class RunnerOptions:
    timeouts: Timeouts = field(default_factory=Timeouts)
    # True: rank 0 hashes and publishes a checkpoint on a thread while training goes on.
    async_persist: bool = True
    # The scheduler's warning (installed by the entry point); None: a warning is not watched.
    warning: WarningNote | None = None
    warning_hold_s: float = 300.0


@dataclass(frozen=True)
class RunOutcome:
    rank: int
    final_step: int
    resumed_from: int  # 0: cold start
    digest: str


class Runner:
    def __init__(
        self, job: RankJob, env: DistEnv, workload: Workload, options: RunnerOptions, started_at: float
    ) -> None:
        self.job, self.env, self.workload, self.options = job, env, workload, options
        self.started_at = started_at
        self.paths = RunPaths(Path(job.run_dir))
        self.store = CheckpointStore(self.paths.root, job.checkpoint_keep)
        self.events = EventLog(self.paths.events_file(job.attempt), enabled=env.is_main)
        self.heartbeat = HeartbeatWriter(self.paths.heartbeat_file(env.rank), job.attempt, job.heartbeat_interval_s)
        self.persist = PersistWorker()
        self.job_id = own_job_id(env.job_id)
        self.train_time_s = 0.0  # time inside train_step in this attempt: the study's step time
        self.steps_trained = 0

    def run(self) -> RunOutcome:
        self._start()
        start_step = self._resume()
        warned_at = self._train(start_step)
        if warned_at is not None:
            self._hold(warned_at)
        return self._finish(start_step)

    def _start(self) -> None:
        env = self.env
        self.events.emit(
            EVENT_PROCESS_START, when=self.started_at, pid=os.getpid(),
            create_time=psutil.Process().create_time(), world_size=env.world_size,
            num_nodes=env.num_nodes, scheduler=env.scheduler, job_id=env.job_id, node=env.node,
        )
        if env.is_main:
            # Before setup: no other rank can write a checkpoint until rank 0 joins the group.
            self.store.remove_stale()
        timings = self.workload.setup(env, self.job.workload, self.options.timeouts)
        self.events.emit(EVENT_FRAMEWORK_READY, since_start_s=time.time() - self.started_at,
                         determinism=self.workload.determinism, **timings)

    def _resume(self) -> int:
        """Agree on the newest valid checkpoint (rank 0 verifies, all load); 0 means cold start."""
        started = time.monotonic()
        step, verify_s, skipped = 0, 0.0, []
        checkpoint_s = self.options.timeouts.checkpoint_s
        with self.heartbeat.phase("resume", checkpoint_s, step=0):
            if self.env.is_main:
                found = self.store.newest_valid()
                verify_s = time.monotonic() - started
                step = found.step if found else 0
                # Newer checkpoints that could not be used: the fallback's extra lost work.
                skipped = [found for found, _ in self.store.set_aside_newer_than(step)]
            # The others wait while rank 0 hashes: a checkpoint's time, not a collective's.
            step = self.workload.broadcast_int(step, checkpoint_s)
            if step > 0:
                self._load(step)
        load_s = time.monotonic() - started
        self.events.emit(EVENT_CHECKPOINT_LOADED, step=step, load_s=load_s, verify_s=verify_s, skipped=skipped)
        self.heartbeat.beat(step, force=True)
        return step

    def _load(self, step: int) -> None:
        """Load checkpoint ``step``; one this rank cannot load is kept out of the next choice, so
        that the next attempt falls back to an older one instead of failing on it again."""
        try:
            self.workload.load(self.store.step_dir(step), step)
        except Exception as error:
            self.store.reject(step, self.env.rank, self.job.attempt, f"{type(error).__name__}: {error}")
            raise

    def _train(self, start_step: int) -> int | None:
        """Train to the last step; the step at which the scheduler's warning stopped it, if it did."""
        total, every = self.job.workload.steps, self.job.checkpoint_every
        for step in range(start_step + 1, total + 1):
            step_started = time.monotonic()
            loss = self.workload.train_step(step)
            self.train_time_s += time.monotonic() - step_started
            self.steps_trained += 1
            if self.env.is_main:
                append_json_line(self.paths.loss_log, {"attempt": self.job.attempt, "step": step, "loss": loss})
            if step == start_step + 1:
                self.events.emit(EVENT_FIRST_STEP, step=step)
            checkpoint_due = every > 0 and step % every == 0
            self.heartbeat.beat(step, force=checkpoint_due or step == total)
            if checkpoint_due:
                self._checkpoint(step)
            if step < total and self._warning_agreed(step):
                self._checkpoint_on_warning(step, already=checkpoint_due)
                return step
        return None

    def _warning_agreed(self, step: int) -> bool:
        """Rank 0's warning, seen by every rank at the same step (so that all save that step)."""
        note = self.options.warning
        if note is None:
            return False
        if self.env.world_size == 1:
            return note.received
        if step % WARNING_POLL_STEPS:
            return False
        return self.workload.broadcast_int(int(note.received)) == 1

    def _checkpoint_on_warning(self, step: int, already: bool) -> None:
        note = self.options.warning
        assert note is not None
        started = time.monotonic()
        if not already:
            self._checkpoint(step)
        with self.heartbeat.phase("checkpoint", self.options.timeouts.checkpoint_s, step):
            self.persist.wait()  # durable before the scheduler may end the job
        self.events.emit(EVENT_WARNED, step=step, signal=note.signal.name, received_at=note.received_at,
                         checkpoint_s=time.monotonic() - started)

    def _hold(self, step: int) -> None:
        """Train no more: wait for the scheduler to end the job; if it never does, exit EXIT_WARNED."""
        hold_s = self.options.warning_hold_s
        with self.heartbeat.phase("warned", hold_s + 60.0, step):
            wait_for_the_end(hold_s)
        raise SystemExit(EXIT_WARNED)

    def _checkpoint(self, step: int) -> None:
        """Every rank writes its share, all meet, rank 0 publishes (on a thread if async)."""
        with self.heartbeat.phase("checkpoint", self.options.timeouts.checkpoint_s, step):
            self._write_checkpoint(step)

    def _write_checkpoint(self, step: int) -> None:
        started = time.monotonic()
        if self.env.is_main:
            self.persist.wait()  # publish in step order; never two commits in flight
        sink = self.store.sink(step, self.env.rank)
        try:
            self.workload.save(sink, step)
            sink.close()
        except Exception as error:
            raise explain_write_failure(error, self.store.root, step) from error
        self.workload.barrier(self.options.timeouts.checkpoint_s)
        asynchronous = self.options.async_persist
        # Synchronous: training waits for the whole commit, so blocking time is persist time.
        blocking_s = time.monotonic() - started if asynchronous else None
        if self.env.is_main:
            commit = functools.partial(
                self.store.commit, step, self.job.attempt, self.workload.checkpoint_meta, started, blocking_s,
                ranks=self.env.world_size, before_publish=self._check_fence,
            )
            if asynchronous:
                self.persist.submit(commit)
            else:
                self.persist.records.append(commit())
        if not asynchronous:
            self.workload.barrier(self.options.timeouts.checkpoint_s)

    def _check_fence(self, doing: str = "publishing a checkpoint") -> None:
        check_current(self.paths, self.job.attempt, self.job_id, doing)

    def _finish(self, start_step: int) -> RunOutcome:
        final_step = max(start_step, self.job.workload.steps)
        with self.heartbeat.phase("finish", self.options.timeouts.checkpoint_s, final_step):
            self.persist.wait()
            # Every rank reached the end before rank 0 declares the run complete.
            self.workload.barrier(self.options.timeouts.checkpoint_s)
            digest = self.workload.digest()
            if self.env.is_main:
                self._write_final(final_step, digest)
        self.workload.shutdown()
        return RunOutcome(rank=self.env.rank, final_step=final_step, resumed_from=start_step, digest=digest)


    def _write_final(self, final_step: int, digest: str) -> None:
        self._check_fence("writing the final record")
        if self.job.keep_final_weights:
            save_weights(self.paths.final_weights, self.workload.named_weights())
        record = FinalRecord(step=final_step, digest=digest, time=time.time(), attempt=self.job.attempt)
        write_json_atomic(self.paths.final, record_dict(record))
        step_time_s = self.train_time_s / self.steps_trained if self.steps_trained else 0.0
        self.events.emit(EVENT_COMPLETED, step=final_step, digest=digest, step_time_s=step_time_s)


def save_weights(path: Path, named: list[tuple[str, np.ndarray]]) -> None:
    """Named arrays to ``path`` atomically (temporary name, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.savez(handle, **dict(named))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def run_training(
    job: RankJob, env: DistEnv, workload: Workload, started_at: float, options: RunnerOptions | None = None
) -> RunOutcome:
    """Run (or resume) one attempt of one run on this rank; raises if any rank fails."""
    return Runner(job, env, workload, options or RunnerOptions(), started_at).run()
