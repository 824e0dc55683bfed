"""One run's state machine: submit, watch, inject its planned faults, detect failure, resubmit."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    CheckpointRecord,
    EVENT_STEP_EXIT,
    FinalRecord,
    RankJob,
    read_json_lines,
)
from injectors.kill_rank import FaultOutcome
from injectors.schedule import PlannedFault
from orchestrator.backends.base import Backend, KillRequest, Submission
from orchestrator.ledger import FaultRow, Ledger
from orchestrator.measure import completion_facts
from orchestrator.recovery import Failure, compute_recovery
from orchestrator.runs import RunConfig
from orchestrator.states import JobState
from orchestrator.tails import JsonlTail

log = logging.getLogger(__name__)

DONE_STATUSES = ("completed", "failed", "gave_up")


@dataclass
class AttemptWatch:
    """What the controller has seen of the current attempt so far."""

    attempt: int
    job_id: str
    events: JsonlTail
    checkpoint_tail: JsonlTail
    heartbeat_tails: list[JsonlTail]
    training_started: float | None = None
    first_checkpoint: float | None = None
    last_heartbeat: float | None = None
    last_step: int = 0
    step_exit: dict[str, float] | None = None
    completed: bool = False  # rank 0 wrote the final record: the ranks are only exiting now
    state: JobState = JobState.PENDING
    running_since: float | None = None  # first poll that saw it RUNNING: queue time is not start time


class RunTracker:
    def __init__(
        self, run: RunConfig, plan: list[PlannedFault], backend: Backend, ledger: Ledger,
        injector_pool: ThreadPoolExecutor, drill_id: str,
    ) -> None:
        self.run = run
        self.plan = plan
        self.backend = backend
        self.ledger = ledger
        self.pool = injector_pool
        self.drill_id = drill_id
        self.watch: AttemptWatch | None = None
        self.status = ledger.run(run.run_id).status
        self.next_fault = len(ledger.faults(run.run_id))
        self._fault_in_flight: tuple[int, Future[FaultOutcome]] | None = None
        self._fault_id = 0
        # Failed attempts whose job the scheduler has not reported final yet: attempt -> job id.
        self.closing: dict[int, str] = {}
        self._awaiting_recovery: int | None = None

    @property
    def done(self) -> bool:
        return self.status in DONE_STATUSES

    @property
    def job_id(self) -> str | None:
        return self.watch.job_id if self.watch else None

    def watched_job_ids(self) -> list[str]:
        """The current job and the failed ones still finishing: all polled in the same batch."""
        current = [self.job_id] if self.job_id is not None and not self.done else []
        return current + list(self.closing.values())

    def settle_closing(self, states: dict[str, JobState]) -> None:
        """Record the final scheduler state of failed attempts once the scheduler has one."""
        for attempt, job_id in list(self.closing.items()):
            state = states.get(job_id, JobState.UNKNOWN)
            if state.is_terminal or state is JobState.UNKNOWN:
                self.ledger.update_attempt(self.run.run_id, attempt, state=state.value)
                del self.closing[attempt]

    # submission -------------------------------------------------------------------------------
    def start(self) -> None:
        """Submit the first attempt, or adopt the attempt an earlier controller left running."""
        attempts = self.ledger.attempts(self.run.run_id)
        if attempts and attempts[-1].job_id and attempts[-1].ended is None:
            self.backend.adopt(attempts[-1].job_id, self.run)
            self._adopt(attempts[-1].attempt, attempts[-1].job_id)
            return
        if attempts and attempts[-1].job_id is None:
            last = attempts[-1].attempt
            found = self.backend.find_submitted(self.run, last)
            if found is not None:
                self.ledger.update_attempt(self.run.run_id, last, job_id=found, accepted=attempts[-1].submitted)
                self.backend.adopt(found, self.run)
                self._adopt(last, found)
                return
            self.ledger.update_attempt(self.run.run_id, last, state="LOST", ended=time.time(),
                                       reason="controller stopped before the scheduler answered")
        self._submit(len(attempts))

    @property
    def fresh(self) -> bool:
        """Never submitted: can go out in a job array with other fresh runs."""
        return not self.done and not self.ledger.attempts(self.run.run_id)

    def begin_attempt(self, attempt: int) -> RankJob:
        """Record the attempt before it is submitted (a restarted controller then knows to look)."""
        run = self.run
        self.ledger.update_run(run.run_id, status="running", started=time.time())
        self.status = "running"
        self.ledger.add_attempt(run.run_id, attempt)
        return RankJob(
            run_id=run.run_id, run_dir=str(run.paths.root), attempt=attempt, workload=run.workload,
            checkpoint_every=run.campaign.checkpoint.every_steps, checkpoint_keep=run.campaign.checkpoint.keep,
            drill_id=self.drill_id, keep_final_weights=self.run.keeps_final_weights,
        )

    def accept(self, attempt: int, submission: Submission) -> None:
        self.ledger.update_attempt(self.run.run_id, attempt, job_id=submission.job_id,
                                   state=JobState.PENDING.value, accepted=submission.accepted_at)
        self._adopt(attempt, submission.job_id)
        log.info("%s: attempt %d is job %s", self.run.run_id, attempt, submission.job_id)

    def _submit(self, attempt: int) -> None:
        job = self.begin_attempt(attempt)
        self.accept(attempt, self.backend.submit(self.run, job))

    def _adopt(self, attempt: int, job_id: str) -> None:
        paths = self.run.paths
        self.watch = AttemptWatch(
            attempt=attempt, job_id=job_id, events=JsonlTail(paths.events_file(attempt)),
            checkpoint_tail=JsonlTail(paths.checkpoint_log),
            heartbeat_tails=[JsonlTail(paths.heartbeat_file(rank)) for rank in range(self.run.ranks)],
        )
        self._awaiting_recovery = attempt if attempt > 0 else None
        self.status = "running"

    # one step of the loop ---------------------------------------------------------------------
    def advance(self, state: JobState, now: float) -> None:
        watch = self.watch
        if watch is None or self.done:
            return
        self._read_files(watch)
        self._record_state(watch, state, now)
        self._collect_fault()
        self._maybe_record_recovery()
        failure_reason = self._failure_reason(watch, state, now)
        if failure_reason is not None and self._final_of(watch) is None:
            self._on_failure(watch, failure_reason, state, now)
        elif state is JobState.COMPLETED or failure_reason is not None:
            # The final record of this attempt is the proof of the work: a job that failed while
            # its ranks were exiting still trained to the end.
            self._on_job_completed(watch, state, now)
        else:
            self._maybe_inject(watch, now)

    def _read_files(self, watch: AttemptWatch) -> None:
        for event in watch.events.read_new():
            if event.get("event") == EVENT_FIRST_STEP and watch.training_started is None:
                watch.training_started = float(event["time"])
            if event.get("event") == EVENT_COMPLETED:
                watch.completed = True
            if event.get("event") == EVENT_STEP_EXIT:
                watch.step_exit = {"time": float(event["time"]), "exit_code": float(event["exit_code"])}
        for record in watch.checkpoint_tail.read_new():
            if record.get("attempt") == watch.attempt and watch.first_checkpoint is None:
                watch.first_checkpoint = float(record["time"])
        for tail in watch.heartbeat_tails:
            for beat in tail.read_new():
                if beat.get("attempt") == watch.attempt:
                    watch.last_heartbeat = max(watch.last_heartbeat or 0.0, float(beat["time"]))
                    watch.last_step = max(watch.last_step, int(beat["step"]))

    def _record_state(self, watch: AttemptWatch, state: JobState, now: float) -> None:
        if state is JobState.RUNNING and watch.running_since is None:
            watch.running_since = now
        if state is not watch.state:
            watch.state = state
            self.ledger.update_attempt(self.run.run_id, watch.attempt, state=state.value)

    # failure ----------------------------------------------------------------------------------
    def _failure_reason(self, watch: AttemptWatch, state: JobState, now: float) -> str | None:
        restart = self.run.campaign.restart
        if watch.step_exit is not None and watch.step_exit["exit_code"] != 0:
            return f"rank launch exited with code {int(watch.step_exit['exit_code'])}"
        if state.is_terminal and not state.is_success:
            return f"job {state.value.lower()}"
        if state is JobState.UNKNOWN:
            return "job vanished from the scheduler"
        if watch.completed:
            return None  # no more heartbeats to come; the scheduler reports how the job ends
        if watch.last_heartbeat is not None and now - watch.last_heartbeat > restart.hang_timeout_s:
            return f"hang: no heartbeat for {now - watch.last_heartbeat:.0f} s"
        started = watch.running_since
        if watch.training_started is None and started is not None and now - started > restart.start_timeout_s:
            return f"no training step within {restart.start_timeout_s:.0f} s of the job starting"
        return None

    def _on_failure(self, watch: AttemptWatch, reason: str, state: JobState, now: float) -> None:
        if not state.is_terminal:
            if watch.step_exit is None:  # a hang or a stuck start: the job would hold its nodes
                self.backend.cancel(watch.job_id)
            self.closing[watch.attempt] = watch.job_id
        self.ledger.update_attempt(self.run.run_id, watch.attempt, ended=now, detected=now, reason=reason)
        self._ingest_checkpoints()
        log.warning("%s: attempt %d failed: %s", self.run.run_id, watch.attempt, reason)
        if watch.attempt >= self.run.campaign.restart.max_restarts:
            self._finish("gave_up", now)
            return
        self._submit(watch.attempt + 1)

    def failure_of(self, attempt: int) -> Failure | None:
        """Why ``attempt`` ended: the injected fault that hit it, else a natural failure."""
        row = next(a for a in self.ledger.attempts(self.run.run_id) if a.attempt == attempt)
        if row.detected is None:
            return None
        fault = next((f for f in self.ledger.faults(self.run.run_id) if f.attempt == attempt and f.at), None)
        if fault is not None and fault.at is not None:
            return Failure(kind=fault.kind, at=fault.at, detected=row.detected)
        exit_time = _step_exit_time(self.run, attempt)
        kind = (row.reason or "failure").split(":")[0]
        return Failure(kind=f"natural ({kind})", at=min(exit_time or row.detected, row.detected),
                       detected=row.detected)

    def _maybe_record_recovery(self) -> None:
        attempt = self._awaiting_recovery
        if attempt is None or (self._fault_in_flight and self._fault_in_flight[0] == attempt - 1):
            return
        failure = self.failure_of(attempt - 1)
        if failure is None:
            return
        rows = {a.attempt: a for a in self.ledger.attempts(self.run.run_id)}
        recovery = compute_recovery(self.run.paths, failure, rows[attempt - 1], rows[attempt], self.run.ranks)
        if recovery is not None:
            self.ledger.add_recovery(recovery)
            self._awaiting_recovery = None

    # completion -------------------------------------------------------------------------------
    def _final_of(self, watch: AttemptWatch) -> FinalRecord | None:
        """This attempt's final record, if the run reached its target step in it."""
        if not watch.completed:
            return None
        final = _read_final(self.run)
        if final is None or final.attempt != watch.attempt or final.step != self.run.workload.steps:
            return None
        return final

    def _on_job_completed(self, watch: AttemptWatch, state: JobState, now: float) -> None:
        final = _read_final(self.run)
        self.ledger.update_attempt(self.run.run_id, watch.attempt, ended=now)
        if not state.is_terminal:
            self.closing[watch.attempt] = watch.job_id  # its final scheduler state comes later
        self._ingest_checkpoints()
        if final is None or final.step != self.run.workload.steps:
            self.ledger.update_attempt(self.run.run_id, watch.attempt, reason="completed without a final record")
            self._finish("failed", now)
            return
        self.ledger.update_run(self.run.run_id, final_step=final.step, final_digest=final.digest,
                               **completion_facts(self.run.paths, watch.attempt))
        self._finish("completed", now)

    def _finish(self, status: str, now: float) -> None:
        self._maybe_record_recovery()
        self.status = status
        self.ledger.update_run(self.run.run_id, status=status, ended=now)
        log.info("%s: %s", self.run.run_id, status)

    def _ingest_checkpoints(self) -> None:
        records = [CheckpointRecord(**r) for r in read_json_lines(self.run.paths.checkpoint_log)]
        self.ledger.add_checkpoints(self.run.run_id, records)

    # faults -----------------------------------------------------------------------------------
    def _maybe_inject(self, watch: AttemptWatch, now: float) -> None:
        if self._fault_in_flight is not None or self.next_fault >= len(self.plan):
            return
        if watch.state is not JobState.RUNNING:
            return
        fault = self.plan[self.next_fault]
        anchor = watch.first_checkpoint if fault.anchor == "first_checkpoint" else watch.training_started
        if anchor is None or now < anchor + fault.delay_s:
            return
        fault_id = self.ledger.add_fault(FaultRow(
            fault_id=None, run_id=self.run.run_id, attempt=watch.attempt, plan_index=fault.index, kind=fault.kind,
            target=f"rank {fault.rank}", signal=fault.signal, planned_delay_s=fault.delay_s, at=None, pid=None,
            node=None, outcome="sending",
        ))
        self.next_fault += 1
        request = KillRequest(run=self.run, attempt=watch.attempt, job_id=watch.job_id, rank=fault.rank,
                              signal=fault.signal)
        self._fault_in_flight = (watch.attempt, self.pool.submit(self.backend.kill_rank, request))
        self._fault_id = fault_id

    def _collect_fault(self) -> None:
        if self._fault_in_flight is None or not self._fault_in_flight[1].done():
            return
        future = self._fault_in_flight[1]
        self._fault_in_flight = None
        error = future.exception()
        if error is not None:
            self.ledger.update_fault(self._fault_id, outcome=f"refused: {error}".splitlines()[0][:500])
            log.warning("%s: fault not injected: %s", self.run.run_id, error)
            return
        outcome = future.result()
        self.ledger.update_fault(self._fault_id, at=outcome.at, pid=outcome.pid, node=outcome.node,
                                 target=f"rank {outcome.rank}@{outcome.node}", outcome="injected")


def _read_final(run: RunConfig) -> FinalRecord | None:
    try:
        return FinalRecord(**json.loads(run.paths.final.read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def _step_exit_time(run: RunConfig, attempt: int) -> float | None:
    for event in read_json_lines(run.paths.events_file(attempt)):
        if event.get("event") == EVENT_STEP_EXIT:
            return float(event["time"])
    return None
