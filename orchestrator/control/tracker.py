"""One run's state machine: submit, watch, fault, detect failure, restart (or give up).

Its parts live beside it: getting an attempt to the scheduler (orchestrator.control.submission),
the facts of a failure (orchestrator.observe.failure_signs, then the class table and the policy)
and their record (orchestrator.control.failed_attempt), restarts in the same job
(orchestrator.control.same_job_attempts), faults (orchestrator.faults.book), failed jobs until they
end (orchestrator.control.closing), recoveries (orchestrator.control.recovery_record).

Every decision is in the ledger before it is acted on, writes that belong together go in one
transaction, and the fence (experiments.runtime.fence) names the current attempt before its job is
submitted and the job once it was accepted: a controller stopped at any moment is replaced by one
that picks up from the ledger (``start``) without submitting twice, and any job that is not the
current attempt's starts nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from experiments.file_changes import FileChanges
from experiments.layout import RANK_STEP_NAME, CheckpointRecord, FinalRecord, RankJob, read_json_lines
from experiments.runtime.fence import (
    Fence,
    fence_unless_moved_on,
    write_fence,
    write_fence_unless_ahead,
)
from experiments.runtime.heartbeat import interval_for
from experiments.runtime.identity import ticks_now
from experiments.runtime.mounts import on_local_filesystem
from injectors.kinds.base import FaultOutcome
from injectors.schedule import PlannedFault
from orchestrator.backends.base import Backend, Submission
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.capabilities import Capability
from orchestrator.campaign.failure_classes import DrillEnded, FailureClass, classify
from orchestrator.campaign.policy import Decision, decide, policy_entry, restarts_left
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import HEARTBEATS_PER_HANG, time_limit_minutes
from orchestrator.control.cancels import DrillCancels, cancel_every_job
from orchestrator.control.closing import ClosingJobs
from orchestrator.control.failed_attempt import STEP_FAILED, reclassify_at_end, reclassify_with_record, record_failure
from orchestrator.control.recovery_record import RecoveryRecorder
from orchestrator.control.same_job_attempts import SameJobAttempts
from orchestrator.control.submission import SubmissionHooks, Submitter
from orchestrator.faults.book import FaultBook, OnActed, RunProgress
from orchestrator.faults.inject import FaultRequest, inject
from orchestrator.observe.failure_signs import (
    blamed_nodes,
    failure_evidence,
    failure_sign,
    requeued,
)
from orchestrator.observe.node_check import CheckPool, NodeChecks
from orchestrator.observe.node_clocks import ClockBook
from orchestrator.observe.watch import AttemptWatch, FailureSign
from orchestrator.record.clocks import AttemptClocks
from orchestrator.record.ledger import AttemptRow, Ledger
from orchestrator.record.measure import completion_facts
from orchestrator.record.recovery import last_progress
from orchestrator.render.scripts import attempt_job_name
from orchestrator.states import TERMINAL_STATE_NAMES, JobState
from orchestrator.strategies.base import Continuation, FailedJob, FailureFacts
from orchestrator.strategies.registry import strategy_for
from orchestrator.strategies.same_job import Requeuer, end_rank_launch

log = logging.getLogger(__name__)

DONE_STATUSES = ("completed", "failed", "gave_up", "cancelled")
FINISH_NEWS_S = 10.0  # after the final record, the job's end is polled early this long
CANCELLED_BY_USER = "cancelled by the user (faultdrill cancel)"
# A failed attempt recorded so goes on in its job as the next attempt (orchestrator.control.failed_attempt).
CONTINUED_IN_JOB = frozenset({STEP_FAILED, JobState.REQUEUED.value})
# in-allocation: a backoff that leaves the batch script less than this of its wait for the go
# (restart.relaunch_wait_s, from the launch's exit) takes a new job instead (detection, clocks).
RELAUNCH_MARGIN_S = 10.0
# The classes of a job the scheduler takes back (after its warning): no next attempt runs in it.
JOB_TAKEN_BACK = frozenset({FailureClass.PREEMPTED, FailureClass.TIMEOUT})


# The runs of a sweep share a directory: its filesystem looked up once (the mount table read and
# parsed for each of 10,000 runs took seconds), not once a run.
_interval_for = functools.lru_cache(maxsize=64)(interval_for)
_on_this_host = functools.lru_cache(maxsize=64)(on_local_filesystem)  # a sweep's runs share their directory


class RunTracker:
    def __init__(
        self, run: RunConfig, plan: list[PlannedFault], backend: Backend, ledger: Ledger,
        injector_pool: ThreadPoolExecutor, drill_id: str, calls: SchedulerCalls | None = None,
        clocks: ClockBook | None = None, node_check_pool: CheckPool | None = None,
        changes: FileChanges | None = None,
    ) -> None:
        self.run = run
        self.plan = plan
        self.backend = backend
        self.ledger = ledger
        self.drill_id = drill_id
        self.restart = run.campaign.restart
        self.heartbeat_s = _interval_for(run.paths.root.parent, self.restart.heartbeat_s,
                                         self.restart.hang_timeout_s / HEARTBEATS_PER_HANG)
        # its files on this host's own filesystem: the watch looks at their sizes before it opens them
        self.files_on_this_host = _on_this_host(run.paths.root.parent)
        self.changes = changes if self.files_on_this_host else None  # the kernel's word of what was written
        self.strategy = strategy_for(self.restart.strategy)
        progress = RunProgress(lambda attempt, at: last_progress(run.paths, run.ranks, attempt, at)[0], run.workload.steps)
        self.clocks = clocks  # reads each attempt's node clocks once its ranks have registered
        self._clock_reads: dict[int, Future[AttemptClocks]] = {}
        self._observed: tuple[AttemptWatch, float, JobState] | None = None  # this round's reading (observe)
        # a node of the attempt whose ranks fell silent: checked, lost at once if it does not answer
        # (not under a coordinator of the job's own, warm's or torchrun's: its word comes first)
        own_coordinator = run.strategy_traits.warm or run.strategy_traits.torchrun
        self.node_checks = (NodeChecks(run, backend, self.restart.node_silence_s, self.heartbeat_s, node_check_pool)
                            if node_check_pool is not None and not own_coordinator else None)
        self.faults = FaultBook(run.run_id, plan, ledger, injector_pool, self._act, self._late_record, progress,
                                run.paths, clocks_pending=self._clocks_pending)
        for attempt in self.faults.caused_oom_attempts():  # idempotent: a class taken again changes once
            self._late_record(attempt)
        self.watch: AttemptWatch | None = None
        calls = calls or SchedulerCalls(off_loop=False)  # sbatch and scancel, off the loop where they are slow
        self.cancels = DrillCancels(run.run_id, ledger, backend, calls)  # the drill's own, journaled first
        self.submitter = Submitter(run, backend, ledger, drill_id, self.restart,
                                   SubmissionHooks(accepted=self.accept, gave_up=self._next_or_give_up, refused=self._give_up,
                                                   cancel=self.cancels.ask), calls)
        self.requeuer = Requeuer(run, backend, self.restart.cancel_timeout_s, accepted=self.accept,
                                 refused=self._requeue_refused, calls=calls)
        self.same_job = SameJobAttempts(run, backend, ledger, drill_id, self, self.requeuer, self.cancels,
                                        next_after=self._next_or_give_up)
        self.closing = ClosingJobs(run.run_id, ledger, self._cancel_failed_job, self.restart.cancel_timeout_s,
                                   on_final_state=self._final_state)
        self.status = ledger.run(run.run_id).status
        self.recoveries = RecoveryRecorder(run, ledger, self.faults, clocks_pending=self._clocks_pending,
                                           events_read=self._events_read)
        self._started_recorded: str | None = None  # the event the recorded start was read from
        self._last_job_id: str | None = None  # the job the last attempt watched ran in
        self._finalized = False

    @property
    def done(self) -> bool:
        return self.status in DONE_STATUSES

    @property
    def job_id(self) -> str | None:
        return self.watch.job_id if self.watch else None

    @property
    def fresh(self) -> bool:
        """Never submitted: can go out in a job array with other fresh runs."""
        return not self.done and not self.ledger.attempts(self.run.run_id)

    @property
    def awaits_scheduler(self) -> bool:
        """The run's files say its job has started while the scheduler last said it was pending
        (faults wait for RUNNING), or that it is ending (the rank step exited, the final record is
        written), or a rank fell silent (a hang, unless the job is suspended): the scheduler's word
        is wanted before the next regular poll."""
        watch = self.watch
        if watch is None or self.done or watch.state.is_terminal:
            return False
        started_unseen = watch.job_started is not None and watch.state is JobState.PENDING
        # The final record is written: the job's end is news for a few seconds; an exit that
        # lingers past them (a hung teardown) waits at the regular pace for finish_timeout_s.
        ending = watch.completed and (watch.completed_seen_at is None
                                      or time.time() - watch.completed_seen_at < FINISH_NEWS_S)
        lost_node = self.node_checks is not None and self.node_checks.awaiting_poll
        return started_unseen or watch.step_exit is not None or ending or watch.silent_since is not None or lost_node

    @property
    def queued_unheard(self) -> bool:
        """The run's one job waits in the scheduler's queue (its poll says PENDING, never RUNNING)
        and nothing of it was heard: a round has nothing to read or decide for it until the
        scheduler starts it (orchestrator/control/scheduler_queue.py)."""
        watch = self.watch
        return (watch is not None and not self.done and watch.queued and watch.state is JobState.PENDING
                and watch.unheard and self.submitter.pending is None and self.watched_job_ids() == [watch.job_id])

    def attempt_begun(self) -> bool:
        """The attempt's job has begun: its directory is there (the batch script's or a rank's
        first event makes it). One look at the disk, for a job that waits in the scheduler's queue."""
        watch = self.watch
        return watch is not None and os.path.isdir(watch.paths.attempt_dir(watch.attempt))

    def watched_job_ids(self) -> list[str]:
        """The current job and the failed ones still finishing: all polled in the same batch."""
        current = [self.job_id] if self.job_id is not None and not self.done else []
        held = self.requeuer.held_job_id(time.time())  # a requeue that waits out a backoff
        return current + ([held] if held is not None and not self.done else []) + self.closing.job_ids

    # starting ---------------------------------------------------------------------------------
    def start(self, now: float, durable: bool = True) -> None:
        """Pick up where the ledger (and the run directory) says the run is: complete it from its
        final record, adopt or find the attempt in flight, give up, or submit the next attempt.
        ``durable`` False: an adopted attempt's fence is made durable by the caller, with the
        others a restarted controller adopts (one sync for a sweep's thousands, not two each)."""
        if self.done:
            return
        attempts = self.ledger.attempts(self.run.run_id)
        last = attempts[-1] if attempts else None
        final = self._own_final()
        in_flight = last is not None and last.ended is None and last.job_id is not None
        if final is not None and final.step >= self.run.workload.steps and not (in_flight and last is not None and final.attempt == last.attempt):
            self._complete_from_record(final, last, now)
            return
        if last is not None and last.ended is None:
            self._resume_attempt(last, now, durable)
            return
        if last is None:
            self._submit(0, now)
            return
        self._after_recorded_failure(last, now)

    def _own_final(self) -> FinalRecord | None:
        """The run's final record, if this drill's: an earlier drill's job wrote one (its workdir
        archived, this run directory's path reused) is no proof of this drill's work, and is
        moved aside. (An attempt the ledger has not seen may be this drill's: a warm job numbers
        its re-formations itself.)"""
        final = _read_final(self.run)
        if final is None or not final.drill_id or final.drill_id == self.drill_id:
            return final
        aside = self.run.paths.final.with_name(f"{self.run.paths.final.name}.foreign-{time.time_ns()}")
        os.replace(self.run.paths.final, aside)
        log.warning("%s: %s was written by drill %s, not this one: moved aside to %s", self.run.run_id,
                    self.run.paths.final, final.drill_id, aside.name)
        return None

    def _after_recorded_failure(self, last: AttemptRow, now: float) -> None:
        """An earlier controller recorded ``last``'s failure and stopped before the next attempt:
        the policy decides again, and what that controller had not carried out is."""
        decision = self._decide(last.attempt)
        if not decision.restart:
            # An earlier controller died before it journaled this cancel (one it journaled: reclaim_cancels).
            if last.job_id is not None and last.state in CONTINUED_IN_JOB and self.cancels.why(last.job_id) is None:
                self._cancel_job_of_next(last.attempt, last.job_id, now)
            self._give_up(decision.reason, now)
            return
        # An earlier controller recorded the failure and died before the next attempt: a new job,
        # after what is left of the policy's backoff (from the failure's end) — unless the failed
        # attempt's job went on by itself (a warm coordinator re-formed it): the run follows it.
        if last.job_id is not None and not fence_unless_moved_on(
                self.run.paths, Fence(last.attempt, last.job_id, self.drill_id), Fence(last.attempt + 1, None, self.drill_id)):
            self.same_job.follow_warm(last.attempt + 1, last.job_id)
            return
        if last.job_id is not None and last.state in CONTINUED_IN_JOB and self.cancels.why(last.job_id) is None:
            # The job the failed attempt's successor was to run in (a hung launch's, waiting for a
            # go) holds its nodes for nothing: the drill's to cancel.
            self._cancel_job_of_next(last.attempt, last.job_id, now, why="a restarted controller took a new job; "
                                     "the job the next attempt would have run in was cancelled")
        not_before = (last.ended or now) + decision.backoff_s
        self._submit(last.attempt + 1, now, not_before=not_before if not_before > now else None)

    def reclaim_cancels(self, now: float) -> None:
        """The jobs the drill journaled as its own to cancel (``ended_by_drill``) whose end no
        controller saw: a controller died between the journal and the cancel, or before the
        scheduler showed the end. Cancelled again, and followed to their end like every failed job's."""
        rows = self.ledger.attempts(self.run.run_id)
        # The in-flight attempt's own journaled cancel is its watch's to follow; one journaled for an
        # earlier attempt of the same job (a hung launch that could not be ended alone, the kill
        # thread's controller dead before the scancel) is carried out, and ends the in-flight one too.
        in_flight = rows[-1].job_id if rows and rows[-1].ended is None and rows[-1].ended_by_drill else None
        reclaimed: set[str] = set()
        for row in rows:
            if (row.ended_by_drill and row.job_id and row.job_id not in reclaimed | {in_flight}
                    and row.state not in TERMINAL_STATE_NAMES and row.attempt not in self.closing.jobs):
                reclaimed.add(row.job_id)
                log.info("%s: job %s of attempt %d was to be cancelled by the drill: cancelled again", self.run.run_id,
                         row.job_id, row.attempt)
                self.cancels.ask(row.job_id)
                self.closing.add(row.attempt, row.job_id, now, cancelled=True)

    def _resume_attempt(self, row: AttemptRow, now: float, durable: bool = True) -> None:
        """Adopt the attempt an earlier controller left in flight. One whose job id it never
        recorded is a submission that may or may not have reached the scheduler: looked up, and
        adopted, or submitted again (a late job of the first try is then fenced off by its id)."""
        if self.same_job.resume(row, now):  # it stopped around a requeue, or while a go was held
            return
        if row.job_id is not None:
            self.backend.adopt(row.job_id, self.run, self.rank_job(row.attempt))
            # A warm job's coordinator may have fenced later generations while no controller ran (else
            # a fence is ahead of the ledger only by the job a submission's call fenced before the
            # loop recorded it: the same attempt and job, written again).
            write_fence_unless_ahead(self.run.paths, Fence(row.attempt, row.job_id, self.drill_id), durable)
            # Every writer's events read: the job was submitted by an earlier controller, perhaps
            # under a spec since changed (warm then, a coordinator's events now unlooked-for).
            self._watch(row.attempt, row.job_id, every_writer=True)
            return
        self.submitter.retry(row.attempt, self.rank_job(row.attempt), "its submission may not have reached the scheduler",
                             now, not_before=row.not_before)

    def _complete_from_record(self, final: FinalRecord, last: AttemptRow | None, now: float) -> None:
        """The run's final record shows it reached its last step: a controller stopped before it
        recorded that. Complete it instead of submitting anything."""
        if last is not None and last.ended is None and last.job_id is not None:
            self.cancels.ask(last.job_id)  # an attempt after the one that finished: not needed
        self._ingest_checkpoints()
        with self.ledger.transaction():
            if last is not None and last.ended is None:
                self.ledger.update_attempt(self.run.run_id, last.attempt, ended=now)
            self.ledger.update_run(self.run.run_id, final_step=final.step, final_digest=final.digest,
                                   **completion_facts(self.run.paths, final.attempt))
            self._finish("completed", now)

    # submission -------------------------------------------------------------------------------
    def rank_job(self, attempt: int, excluded: tuple[str, ...] | None = None) -> RankJob:
        """``excluded``: the nodes the attempt stays off, where the caller just recorded them
        (else read back from its row)."""
        run = self.run
        if excluded is None:
            row = next((row for row in self.ledger.attempts(run.run_id) if row.attempt == attempt), None)
            excluded = tuple(row.excluded_nodes.split(",")) if row is not None and row.excluded_nodes else ()
        return RankJob(
            run_id=run.run_id, run_dir=str(run.paths.root), attempt=attempt, workload=run.workload,
            checkpoint_every=run.campaign.checkpoint.every_steps, checkpoint_keep=run.campaign.checkpoint.keep,
            drill_id=self.drill_id, keep_final_weights=run.keeps_final_weights, exclude_nodes=excluded,
            fault_steps=run.fault_steps,
            # elastic: the restarts the run has left (its failures so far, as the policy counts them)
            torchrun_restarts=self._restarts_left(attempt) if run.strategy_traits.torchrun else 0,
            heartbeat_interval_s=self.heartbeat_s,
        )

    def _restarts_left(self, attempt: int) -> int:
        return restarts_left(self.restart.policy, self._history(attempt - 1), self.restart.max_restarts)

    def _exclusions(self, attempt: int) -> tuple[str, ...]:
        """The nodes ``attempt`` stays off: those earlier attempts lost in a failure whose policy
        says exclude_node, the most recent first, at most restart.max_excluded_nodes."""
        if attempt == 0 or not self.backend.offers(Capability.EXCLUDE_NODES):
            return ()  # none before the first
        nodes: list[str] = []
        for row in sorted(self.ledger.attempts(self.run.run_id), key=lambda row: -row.attempt):
            if row.attempt >= attempt or not row.failed_nodes or not row.failure_class:
                continue
            if policy_entry(self.restart.policy, FailureClass(row.failure_class)).exclude_node:
                nodes += [node for node in row.failed_nodes.split(",") if node not in nodes]
        return tuple(nodes[:self.restart.max_excluded_nodes])

    def begin_attempt(self, attempt: int, job_name: str | None = None, array_index: int | None = None,
                      durable: bool = True, fence: bool = True) -> RankJob:
        """Record the attempt and fence the run on it before it is submitted (a restarted
        controller then knows to look for it, and no older job may start ranks any more).
        ``durable`` False: the caller makes a batch of fences durable before submitting."""
        run = self.run
        excluded = self._exclusions(attempt)
        with self.ledger.transaction():
            self.ledger.mark_running(run.run_id, time.time())
            self.ledger.add_attempt(run.run_id, attempt, job_name or attempt_job_name(run, attempt, self.drill_id),
                                    array_index, excluded_nodes=excluded)
        self.status = "running"
        if fence:
            write_fence(run.paths, Fence(attempt, None, self.drill_id), durable)
        return self.rank_job(attempt, excluded)

    def _submit(self, attempt: int, now: float, not_before: float | None = None) -> None:
        self.watch = None  # the attempt before is over (its job, if still there, is closing)
        with self.ledger.transaction():  # the backoff with the attempt: a controller started later keeps it
            # The fence moves at once (the failed attempt's job is fenced off now), made durable off
            # the loop by the submission's call, before the scheduler hears of the new job; durable
            # here where that call waits (a policy's backoff): a host crash meanwhile must not bring
            # back the fence that admits the failed job.
            job = self.begin_attempt(attempt, durable=not_before is not None and not_before > now)
            if not_before is not None and not_before > now:
                self.ledger.update_attempt(self.run.run_id, attempt, not_before=not_before)
        self.submitter.submit(attempt, job, now, not_before)

    def accept(self, attempt: int, submission: Submission, fence: bool = True) -> None:
        self.ledger.update_attempt(self.run.run_id, attempt, job_id=submission.job_id,
                                   state=JobState.PENDING.value, accepted=submission.accepted_at)
        if fence:  # not behind a later attempt of the same job (a warm coordinator's, while no controller ran)
            write_fence_unless_ahead(self.run.paths, Fence(attempt, submission.job_id, self.drill_id))
        # A job the scheduler just took waits in its queue; the job an attempt runs in again (a
        # relaunch, a warm re-formation, a requeue) is where the scheduler last said it was.
        self._watch(attempt, submission.job_id, queued=submission.job_id != self._last_job_id)
        log.info("%s: attempt %d is job %s", self.run.run_id, attempt, submission.job_id)

    def _watch(self, attempt: int, job_id: str, queued: bool = False, every_writer: bool = False) -> None:
        """``queued``: the scheduler said the job waits in its queue (a poll saying PENDING says it later).
        ``every_writer``: read every events file, not only those the run's writers make."""
        self._last_job_id = job_id
        self.watch = AttemptWatch(attempt=attempt, job_id=job_id, paths=self.run.paths, ranks=self.run.ranks,
                                  event_writers=None if every_writer else self.run.event_writers,
                                  stat_first=self.files_on_this_host, changes=self.changes, queued=queued)
        self._started_recorded = None
        self.recoveries.expect(attempt)
        self.status = "running"

    def _act(self, attempt: int, job_id: str, fault: PlannedFault, on_acted: OnActed) -> FaultOutcome:
        return inject(self.backend, FaultRequest(run=self.run, attempt=attempt, job_id=job_id, fault=fault,
                                                 on_acted=on_acted, known_state=lambda: self._known_state(job_id)))

    def _known_state(self, job_id: str) -> JobState | None:
        """``job_id``'s state as this tracker's watch last heard it from the poller (read from the
        injector's thread: one attribute); None once the watch is on another job."""
        watch = self.watch
        return watch.state if watch is not None and watch.job_id == job_id else None

    # one step of the loop ---------------------------------------------------------------------
    def observe(self, states: dict[str, JobState], now: float, asked_at: float | None = None) -> None:
        """The round's reading of the attempt in flight: its files, the scheduler's word, a held go
        given, what changed noted in the ledger. The controller observes every run in flight in one
        ledger transaction (one commit a round, not one per run and change: issue 29), then
        ``advance``s each, whose decisions commit on their own before they act."""
        if not self.done and self.watch is not None:
            self._observed = (self.watch, now, self._read_round(self.watch, states, now, asked_at))

    def _read_round(self, watch: AttemptWatch, states: dict[str, JobState], now: float,
                    asked_at: float | None) -> JobState:
        self.same_job.give_go(watch, now)
        fresh = asked_at is None or asked_at >= watch.since  # asked before this attempt: not about it
        # No poll this round (or a stale one): the last word stands.
        state = states.get(watch.job_id, watch.state) if fresh else watch.state
        if fresh and states.get(watch.job_id) is JobState.PENDING:
            watch.queued = True
        watch.read(now)
        self._note(watch, state, now)
        return state

    def advance(self, states: dict[str, JobState], now: float, asked_at: float | None = None) -> None:
        """One round: ``states`` is the scheduler's answer (asked at ``asked_at``), if one came."""
        if self.done:
            return
        watch = self.watch
        if watch is None:
            self.faults.collect()
            self.submitter.try_pending(now)
            self.same_job.watch_held_requeue(states, now)
            self.requeuer.try_requeue(now)
            return
        observed, self._observed = self._observed, None
        state = (observed[2] if observed is not None and observed[0] is watch and observed[1] == now
                 else self._read_round(watch, states, now, asked_at))
        self.faults.collect(watch)
        self.recoveries.record()
        node_lost = self.node_checks.lost(watch, now, asked_at) if self.node_checks is not None else None
        sign = failure_sign(watch, state, now, self.restart, self.backend, asked_at, node_lost)
        if sign is not None and self._final_of(watch) is None:
            self._on_failure(watch, sign, state, now)
        elif state is JobState.COMPLETED or sign is not None or self._finish_overdue(watch, now):
            # The final record of this attempt is the proof of the work: a job that failed while
            # its ranks were exiting (or hung there) still trained to the end.
            self._on_job_completed(watch, state, now)
        else:
            self.faults.maybe_fire(watch, now)

    def _note(self, watch: AttemptWatch, state: JobState, now: float) -> None:
        if watch.observe_state(state, now):
            self.ledger.update_attempt(self.run.run_id, watch.attempt, state=state.value)
        if watch.job_started is not None and self._started_recorded != watch.job_started_by:
            self.ledger.update_attempt(self.run.run_id, watch.attempt, started=watch.job_started)
            self._started_recorded = watch.job_started_by
        if self.clocks is not None and watch.ranks_started is not None and watch.attempt not in self._clock_reads:
            self._clock_reads[watch.attempt] = self.clocks.read_attempt(self.run.paths, watch.attempt, self.run.ranks,
                                                                        watch.job_id)

    def _events_read(self, attempt: int) -> int | None:
        """The events the watch took in of ``attempt``; None when it watches another."""
        watch = self.watch
        return watch.events_read if watch is not None and watch.attempt == attempt else None

    def _clocks_pending(self, attempt: int) -> bool:
        read = self._clock_reads.get(attempt)
        return read is not None and not read.done()

    # failure ----------------------------------------------------------------------------------
    def _on_failure(self, watch: AttemptWatch, sign: FailureSign, state: JobState, now: float) -> None:
        """Record the failed attempt and carry out its strategy's answer: what becomes of its job,
        and how the run goes on (orchestrator/strategies/)."""
        lost_nodes = tuple(dict.fromkeys((*self.faults.lost_nodes(watch.attempt), *((sign.node,) if sign.node else ()))))
        evidence = failure_evidence(watch, sign, state, self.backend, lost_nodes,
                                    self.faults.oom_killed(watch.attempt), self.cancels.why(watch.job_id),
                                    self.faults.signalled(watch.attempt, watch.last_step),
                                    time_limit_s=time_limit_minutes(self.run.campaign.resources.time) * 60)
        classified = classify(evidence)
        facts = FailureFacts(job_ended=state.is_terminal, requeued=requeued(watch, state),
                             warm_reformed=sign.evidence == "warm", launch_exited=watch.step_exit is not None,
                             job_taken_back=classified.failure_class in JOB_TAKEN_BACK)
        answer = self.strategy.on_failure(facts)
        failed_nodes = blamed_nodes(self.run, watch, sign, evidence, classified.failure_class,
                                    self.faults.stopped_nodes(watch.attempt))
        # Journal, then act: the failure (the intent of ending a hung launch alone) and the drill's
        # cancel of its job in one transaction, before any scancel or kill: a controller started
        # after a crash in between finds why, and carries it out (reclaim_cancels, start).
        with self.ledger.transaction():
            record_failure(self.ledger, self.run.run_id, watch.attempt, sign, answer.continuation, evidence,
                           classified, failed_nodes, now)
            if answer.failed_job is FailedJob.CANCELLED:
                self.cancels.journal(watch.attempt, watch.job_id, DrillEnded(
                    classified.failure_class.value, f"attempt {watch.attempt} failed; its job was cancelled"))
        self._dispose_of_failed_job(watch, answer.failed_job, classified.failure_class, state, now)
        self._ingest_checkpoints()
        self.faults.attempt_ended(watch.attempt, sign, completed=False)
        log.warning("%s: attempt %d failed: %s", self.run.run_id, watch.attempt, sign.reason)
        self._next_or_give_up(watch.attempt, now, answer.continuation, watch.job_id, already_requeued=facts.requeued,
                              job_state=state)

    def _dispose_of_failed_job(self, watch: AttemptWatch, failed_job: FailedJob, failure_class: FailureClass,
                               state: JobState, now: float) -> None:
        """What the strategy's answer says of the failed attempt's job (journaled with the failure):
        closed (cancelled first if its ranks hold its nodes), its hung launch ended alone, or left
        as it is."""
        if failed_job is FailedJob.STEP_ENDED:
            # From a thread: a step on a dead node takes scancel a MessageTimeout, which would hold
            # up every run.
            why = DrillEnded(failure_class.value, f"attempt {watch.attempt}'s hung launch could not be ended alone")
            attempt = watch.attempt
            # Processes started from now on are the next attempt's (its go is given after this).
            started_before = ticks_now()
            threading.Thread(target=end_rank_launch, args=(self.backend, self.run, attempt, watch.job_id, started_before,
                                                           lambda job_id: self.cancels.from_thread(attempt, job_id, why)),
                             daemon=True, name=f"kill-step-{watch.job_id}").start()
        elif failed_job in (FailedJob.CLOSED, FailedJob.CANCELLED):
            cancel = failed_job is FailedJob.CANCELLED
            if cancel:
                self.cancels.ask(watch.job_id)  # journaled with the failure
            self.closing.add(watch.attempt, watch.job_id, now, cancelled=cancel, state=state)

    def _next_or_give_up(self, attempt: int, now: float, continuation: Continuation = Continuation.NEW_JOB,
                         job_id: str | None = None, already_requeued: bool = False,
                         job_state: JobState | None = None) -> None:
        """The policy's answer to ``attempt``'s failure: give up, or the next attempt as the
        strategy goes on — a new job, or in ``job_id`` (relaunched, requeued, re-formed warm) —
        after the policy's backoff."""
        decision = self._decide(attempt)
        in_job = job_id if continuation.in_same_job else None
        if not decision.restart:
            if in_job is not None:
                self._cancel_job_of_next(attempt, in_job, now)
            self._give_up(decision.reason, now)
            return
        backoff = decision.backoff_s
        log.info("%s: %s%s", self.run.run_id, decision.reason, f", in {backoff:.1f} s" if backoff else "")
        not_before = now + backoff if backoff else None
        why_not_here = (self._why_no_relaunch(attempt + 1, backoff, job_id) if continuation is Continuation.RELAUNCH
                        else None)
        if in_job is not None and why_not_here is not None:
            self._cancel_job_of_next(attempt, in_job, now, why=why_not_here)
            in_job = None
        if in_job is None:
            self._submit(attempt + 1, now, not_before=not_before)
            return
        self.watch = None  # the failed attempt's job goes on as the next attempt
        if continuation is Continuation.RELAUNCH:
            self.same_job.relaunch(attempt + 1, in_job, now, go_at=not_before)
        elif continuation is Continuation.REQUEUE:
            self.same_job.requeue(attempt + 1, in_job, now, already=already_requeued, not_before=not_before,
                                  state=job_state)
        else:
            if backoff:  # its spares are warm and its coordinator re-forms at once (docs/strategies.md)
                log.info("%s: warm re-forms in job %s at once: the policy's backoff is not waited", self.run.run_id,
                         in_job)
            self.same_job.follow_warm(attempt + 1, in_job)

    def _why_no_relaunch(self, attempt: int, backoff: float, job_id: str | None = None) -> str | None:
        """Why ``attempt`` cannot relaunch in the job that is there (a new job takes it, after the
        backoff), if it cannot: the batch script would stop waiting for the go before the backoff
        ends; or the nodes it must stay off leave the allocation too few (more than its spare
        nodes: each launch would fail at once, "required nodes explicitly excluded"); or the job
        ``job_id`` has lost more nodes than it has to spare (a dead node stays in the allocation:
        each relaunch would fail at once, "Requested node configuration is not available", until
        the restart budget is spent), however many of them the next attempt names."""
        if backoff + RELAUNCH_MARGIN_S > self.restart.relaunch_wait_s:
            return (f"the backoff ({backoff:g} s) outlasts the job's wait for the go "
                    f"(restart.relaunch_wait_s = {self.restart.relaunch_wait_s:g})")
        excluded = self._exclusions(attempt)
        spare = self.run.campaign.resources.spare_nodes
        if len(excluded) > spare:
            return (f"attempt {attempt} stays off {', '.join(excluded)}, more nodes than the job's "
                    f"{spare} spare node(s): it cannot relaunch there")
        lost = self._nodes_lost_in(job_id) if job_id is not None else []
        if len(lost) > spare:
            return (f"job {job_id} has lost {', '.join(lost)}, more nodes than its {spare} spare node(s): "
                    f"attempt {attempt} cannot relaunch there")
        return None

    def _nodes_lost_in(self, job_id: str) -> list[str]:
        """The nodes the attempts that ran in ``job_id`` lost to node failures (dead, they stay in
        its allocation)."""
        lost: list[str] = []
        for row in self.ledger.attempts(self.run.run_id):
            if row.job_id == job_id and row.failure_class == FailureClass.NODE_FAIL.value and row.failed_nodes:
                lost += [node for node in row.failed_nodes.split(",") if node not in lost]
        return lost

    def _requeue_refused(self, attempt: int, job_id: str, why: str, now: float) -> None:
        """The scheduler would not requeue the job as ``attempt``: that attempt never runs, the job
        (which holds its nodes, and which the fence names) is cancelled as the drill's, the run
        gives up."""
        failed = self._attempt_row(attempt - 1).failure_class or FailureClass.UNKNOWN.value
        self.cancels.journaled(attempt - 1, job_id, DrillEnded(failed, why))
        self.ledger.update_attempt(self.run.run_id, attempt, state=JobState.CANCELLED.value, ended=now, reason=why)
        # Until the scheduler shows it ended: the cancel escalated (killed, then left behind), not fire-and-forget.
        self.closing.add(attempt - 1, job_id, now, cancelled=True)
        self._give_up(why, now)

    def _cancel_job_of_next(self, attempt: int, job_id: str, now: float,
                            why: str = "the run gave up; the job its next attempt would have run in was cancelled",
                            ) -> None:
        """``attempt``'s job went on to run the next attempt (relaunched, requeued, re-formed warm),
        which will not run there (the run gave up; the backoff outlasts its wait): it waits for a
        go (or in the queue) for nothing. Cancelled as the drill's, with ``attempt``'s class, and
        followed to its end."""
        failed = self._attempt_row(attempt).failure_class or FailureClass.UNKNOWN.value
        self.cancels.journaled(attempt, job_id, DrillEnded(failed, why))
        self.closing.add(attempt, job_id, now, cancelled=True)

    def _decide(self, attempt: int) -> Decision:
        """The restart policy on every failed attempt's class up to ``attempt`` (orchestrator/policy)."""
        return decide(self.restart.policy, self._history(attempt) or [FailureClass.UNKNOWN], self.restart.max_restarts)

    def _history(self, attempt: int) -> list[FailureClass]:
        """Every failed attempt's class up to ``attempt``, in order."""
        return [FailureClass(row.failure_class or FailureClass.UNKNOWN.value)
                for row in self.ledger.attempts(self.run.run_id) if row.attempt <= attempt and row.reason]

    def _give_up(self, reason: str, now: float) -> None:
        log.warning("%s: gave up: %s", self.run.run_id, reason)
        self.ledger.update_run(self.run.run_id, ended_because=reason)
        self._finish("gave_up", now)

    # completion -------------------------------------------------------------------------------
    def _final_of(self, watch: AttemptWatch) -> FinalRecord | None:
        """This attempt's final record, if the run reached its target step in it (a script whose own
        step count went past it, a resume that replayed steps, reached it too: the report names that)."""
        if not watch.completed:
            return None
        final = _read_final(self.run)
        if final is None or final.attempt != watch.attempt or final.step < self.run.workload.steps:
            return None
        return final

    def _finish_overdue(self, watch: AttemptWatch, now: float) -> bool:
        """Rank 0 wrote the final record restart.finish_timeout_s ago (this controller's clock) and
        the job runs on: its ranks hang in their exit (teardown, MPI finalize)."""
        if not watch.completed:
            return False
        if watch.completed_seen_at is None:
            watch.completed_seen_at = now
        return now - watch.completed_seen_at > self.restart.finish_timeout_s

    def _on_job_completed(self, watch: AttemptWatch, state: JobState, now: float) -> None:
        final = _read_final(self.run)
        if not state.is_terminal and self._finish_overdue(watch, now):
            # No failure to class (a completed attempt has no class facts): the record says why it was cancelled.
            why = DrillEnded(FailureClass.UNKNOWN.value,
                             f"attempt {watch.attempt} wrote its final record; its ranks did not exit within "
                             f"restart.finish_timeout_s = {self.restart.finish_timeout_s:g}")
            self.cancels.journaled(watch.attempt, watch.job_id, why)
            self.closing.add(watch.attempt, watch.job_id, now, cancelled=True, state=state)
        elif not state.is_terminal:
            self.closing.add(watch.attempt, watch.job_id, now, cancelled=False, state=state)
        self._ingest_checkpoints()
        reached = final is not None and final.step >= self.run.workload.steps
        self.faults.attempt_ended(watch.attempt, None, completed=reached)
        with self.ledger.transaction():
            if not reached or final is None:
                self.ledger.update_attempt(self.run.run_id, watch.attempt, ended=now,
                                           reason="completed without a final record")
                self._finish("failed", now)
                return
            self.ledger.update_attempt(self.run.run_id, watch.attempt, ended=now)
            self.ledger.update_run(self.run.run_id, final_step=final.step, final_digest=final.digest,
                                   **completion_facts(self.run.paths, watch.attempt))
            self._finish("completed", now)

    def _finish(self, status: str, now: float) -> None:
        self.recoveries.record(force=True)
        if self.watch is not None:
            self.watch.close_files()  # its directories' watches (inotify) go with a finished run, not the drill
        self.status = status
        self.ledger.update_run(self.run.run_id, status=status, ended=now)
        log.info("%s: %s", self.run.run_id, status)

    def finalize(self) -> None:
        """At the end of the drill: the fault in flight collected, every planned fault accounted for."""
        if self._finalized:
            return
        self._finalized = True
        attempts = self.ledger.attempts(self.run.run_id)
        self.faults.finish(self.status, attempts[-1].attempt if attempts else 0)
        self.recoveries.record(force=True)

    def _ingest_checkpoints(self) -> None:
        records = [CheckpointRecord.from_json(r) for r in read_json_lines(self.run.paths.checkpoint_log)]
        self.ledger.add_checkpoints(self.run.run_id, records)

    def ask_cancel(self) -> tuple[list[str], list[str]]:
        """``faultdrill cancel``, first half: every job of the run that may still run is adopted
        (an earlier controller's) and the scheduler asked to cancel it. (The jobs asked, the jobs
        whose cancel it refused.) Nothing is recorded until the scheduler confirms the end."""
        if self.done:
            return [], []
        return cancel_every_job(self.run, self.ledger.attempts(self.run.run_id), self.backend, self.rank_job)

    def record_cancelled(self, now: float) -> None:
        """``faultdrill cancel``, second half, once the scheduler confirmed that the run's jobs
        ended: the attempt in flight and the run end ``cancelled``."""
        if self.done:
            return
        for row in self.ledger.attempts(self.run.run_id):
            if row.job_id is not None and row.state not in TERMINAL_STATE_NAMES and row.ended is None:
                self.ledger.update_attempt(self.run.run_id, row.attempt, ended=now, detected=now,
                                           reason=CANCELLED_BY_USER, failure_class=FailureClass.CANCELLED.value,
                                           class_evidence="faultdrill cancel")
        self.ledger.update_run(self.run.run_id, ended_because=CANCELLED_BY_USER)
        self._finish("cancelled", now)
        self.finalize()

    # jobs that are ending ---------------------------------------------------------------------
    def _final_state(self, attempt: int, state: JobState) -> None:
        row = self._attempt_row(attempt)
        reclassify_at_end(self.ledger, row, state, self.faults.oom_killed(attempt), self.cancels.why(row.job_id),
                          lambda: self._out_of_memory_steps(row.job_id, attempt))

    def _out_of_memory_steps(self, job_id: str | None, attempt: int) -> tuple[str, ...]:
        """The scheduler's out-of-memory steps of ``attempt``: its job's rank steps (a job of its own),
        its named step (in-allocation); none where a job's attempts cannot be told apart by their
        steps (requeue: the last run's steps alone are kept; warm: one coordinator's steps)."""
        traits = self.run.strategy_traits
        if job_id is None or traits.scheduler_requeues or traits.warm:
            return ()
        return self.backend.out_of_memory_steps(job_id, f"{RANK_STEP_NAME}-{attempt}" if traits.relaunches_in_job
                                                else None)

    def _late_record(self, attempt: int) -> None:
        row = self._attempt_row(attempt)
        reclassify_with_record(self.ledger, row, self.faults.oom_killed(attempt),
                               self.faults.signalled(attempt, sys.maxsize))  # its record is in: no step to wait for

    def settle_closing(self, states: dict[str, JobState], now: float) -> None:
        """Record the final scheduler state of failed attempts' jobs (orchestrator.control.closing)."""
        self.closing.settle(states, now)

    def _cancel_failed_job(self, attempt: int, job_id: str, force: bool) -> None:
        """``attempt``'s job, which did not end in time (orchestrator.control.closing): cancelled as
        the drill's with that attempt's class (several attempts may have run in the job)."""
        row = self._attempt_row(attempt)
        why = DrillEnded(row.failure_class or FailureClass.UNKNOWN.value,
                         f"attempt {row.attempt}'s job did not end in time; the drill cancelled it")
        self.cancels.journaled(row.attempt, job_id, why, force=force)

    def _attempt_row(self, attempt: int) -> AttemptRow:
        return next(row for row in self.ledger.attempts(self.run.run_id) if row.attempt == attempt)



def _read_final(run: RunConfig) -> FinalRecord | None:
    try:
        data: Any = json.loads(run.paths.final.read_text())
        return FinalRecord(**data)
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None

