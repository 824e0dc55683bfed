"""What the controller sees of one running attempt: its events, checkpoints and heartbeats as they
are appended, the scheduler's state, and from these whether the attempt is alive, hung or failing.

Liveness is the ranks' heartbeats: a rank is alive while its last beat is younger than the silence
it allows, which is the hang timeout, or the timeout of the long phase (resume, checkpoint, finish)
the rank announced in that beat (if longer). The attempt is hung as soon as one rank is not alive:
ranks of a data-parallel job move in step, so a rank silent past its allowance is stuck even while
the others wait for it inside a long phase. Time spent SUSPENDED by the scheduler is not silence:
the clock starts again when the job resumes.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field

from experiments.file_changes import FileChanges
from experiments.layout import (
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_JOB_START,
    EVENT_PROCESS_START,
    EVENT_STEP_EXIT,
    EVENT_WARM_FAILURE,
    EVENT_WARNED,
    CheckpointRecord,
    EventRecord,
    EventsTail,
    Heartbeat,
    JsonlTail,
    RankError,
    RunPaths,
)
from orchestrator.campaign.failure_classes import is_peer_loss
from orchestrator.states import JobState


@dataclass(frozen=True)
class RankBeat:
    time: float  # as the rank's node stamped it
    allowed_s: float | None  # silence the rank announced it may keep (a long phase); None: hang timeout
    phase: str | None = None
    # When this controller read it, on its own clock: silence is measured on one clock (a node's
    # clock ahead or behind the login node's by more than the hang timeout is no hang, nor hides one).
    seen: float | None = None  # None: the beat's own time


@dataclass(frozen=True)
class FailureSign:
    """Why an attempt is taken as failed, and the best evidence of when it failed."""

    reason: str
    at: float
    evidence: str  # step_exit | scheduler_end | poll | last_heartbeat | job_running | node_check | ...
    rank: int | None = None  # the rank it names (the silent one of a hang)
    node: str | None = None  # the node it names (one lost: orchestrator/observe/node_check.py)


@dataclass(frozen=True)
class LaunchExit:
    """The batch script's step_exit event: the rank launch returned (-1: no code was given)."""

    time: float
    exit_code: int


@dataclass(frozen=True)
class WarmLoss:
    """The warm coordinator's warm_failure event: a rank of the attempt died (-1: no exit code);
    ``what``: the event's own words where it knows less (elastic: the first of a node's workers
    seen gone, not necessarily the one that failed)."""

    time: float
    rank: int
    exit_code: int
    what: str = ""


@dataclass
class AttemptWatch:
    attempt: int
    job_id: str
    paths: RunPaths
    ranks: int
    event_writers: tuple[str, ...] | None = None  # the events files its run's writers make (None: all)
    stat_first: bool = False  # its files are on this host's own filesystem: opened only once they grew (JsonlTail)
    # there, the controller's word of which events files were written (experiments.file_changes)
    changes: FileChanges | None = None
    # The batch script's first line (or rank 0's start, until the script's is read: the local backend
    # has none, and each writer's file may be seen first): the event it was read from.
    job_started: float | None = None
    job_started_by: str | None = None
    ranks_started: float | None = None  # every rank had registered (its identity file): start-up under way
    training_started: float | None = None
    first_checkpoint: float | None = None
    last_step: int = 0
    step_exit: LaunchExit | None = None
    warm_failure: WarmLoss | None = None  # the warm coordinator saw a rank of this attempt die
    completed: bool = False  # rank 0 wrote the final record: the ranks are only exiting now
    completed_seen_at: float | None = None  # when this controller first saw that (its clock)
    warned: bool = False  # the ranks got the scheduler's warning and checkpointed on it
    state: JobState = JobState.PENDING
    queued: bool = False  # the scheduler said the job waits in its queue (took it just now, or a poll said PENDING)
    running_since: float | None = None  # first poll that saw it RUNNING: queue time is not start time
    go_at: float | None = None  # in-allocation: its go is held until then (a policy's backoff): no start clock before
    resumed_at: float | None = None  # last time the scheduler resumed it from SUSPENDED
    suspended_at: float | None = None  # when the scheduler suspended it, while it is
    suspended_s: float = 0.0  # time spent suspended before the last resume (no start clock runs then)
    beats: dict[int, RankBeat] = field(default_factory=dict)
    since: float = field(default_factory=time.time)  # when the controller began to watch it
    silent_since: float | None = None  # a rank fell silent: a hang unless the scheduler says suspended
    # (this controller's clock, step): the first training step heard, and when last_step was first heard
    first_step_heard: tuple[float, int] | None = None
    last_step_heard: float | None = None
    events_read: int = 0  # events taken in so far (what waits on the attempt's events asks again when it moves)

    # The files' readers, made at the first read (a sweep's array submits thousands of attempts
    # whose watch is not read until their job starts).
    @functools.cached_property
    def events(self) -> EventsTail:
        return EventsTail(self.paths, self.attempt, self.event_writers, self.stat_first, self.changes)

    def close_files(self) -> None:
        """Drop the readers (a finished run's: the change feed's watches of its directories with
        them); a later read makes them again and reads from the start."""
        for reader in ("events", "checkpoint_tail", "heartbeat_tails"):
            self.__dict__.pop(reader, None)

    @functools.cached_property
    def checkpoint_tail(self) -> JsonlTail:
        # not through the change feed: the run's directory has files written at every step (the loss)
        return JsonlTail(self.paths.checkpoint_log, CheckpointRecord.from_json, self.stat_first)

    @functools.cached_property
    def heartbeat_tails(self) -> list[JsonlTail]:
        # not through the change feed: a rank writes its heartbeat up to 20 times a second, a round
        # reads it anyway (the kernel's events for it would cost more than the stat they spare)
        return [JsonlTail(self.paths.heartbeat_file(self.attempt, rank), Heartbeat.from_json, self.stat_first)
                for rank in range(self.ranks)]

    @property
    def last_heartbeat(self) -> float | None:
        return max((beat.time for beat in self.beats.values()), default=None)

    @property
    def unheard(self) -> bool:
        """Nothing of the attempt was heard yet: no event, heartbeat or rank file read, never seen
        running by the scheduler, no go held for it."""
        return (self.job_started is None and self.ranks_started is None and self.training_started is None
                and not self.beats and self.step_exit is None and not self.completed and self.warm_failure is None
                and self.running_since is None and self.go_at is None and self.first_checkpoint is None)

    @property
    def failing(self) -> bool:
        """The step already ended badly or the scheduler ended the job: no fault should land here."""
        exit_code = self.step_exit.exit_code if self.step_exit else 0
        return exit_code != 0 or self.warm_failure is not None or (self.state.is_terminal and not self.state.is_success)

    def read(self, now: float | None = None) -> None:
        """Take in what was appended since the last call (``now``: this controller's clock)."""
        seen = time.time() if now is None else now
        for event in self.events.read_new():
            self.events_read += 1
            self._event(event)
        if self.first_checkpoint is None:  # all the watch takes from the log: not read again after it
            for record in self.checkpoint_tail.read_new():
                if record.attempt == self.attempt and self.first_checkpoint is None:
                    self.first_checkpoint = record.time
        for rank, tail in enumerate(self.heartbeat_tails):
            for beat in tail.read_new():
                if beat.attempt == self.attempt:
                    self._beat(rank, beat, seen)
        if self.ranks_started is None:
            self.ranks_started = self._registered()

    def _registered(self) -> float | None:
        """When the last rank wrote its identity file, once every rank has; None before."""
        newest = 0.0
        for rank in range(self.ranks):
            try:
                newest = max(newest, self.paths.rank_file(self.attempt, rank).stat().st_mtime)
            except FileNotFoundError:
                return None
        return newest

    def _event(self, event: EventRecord) -> None:
        name, when = event.name, event.time
        if name == EVENT_JOB_START and self.job_started_by != EVENT_JOB_START:
            self.job_started, self.job_started_by = when, name
        elif name == EVENT_PROCESS_START and self.job_started is None:
            self.job_started, self.job_started_by = when, name
        elif name == EVENT_FIRST_STEP and self.training_started is None:
            self.training_started = when
        elif name == EVENT_COMPLETED:
            self.completed = True
        elif name == EVENT_WARNED:
            self.warned = True
        elif name == EVENT_STEP_EXIT:
            self.step_exit = LaunchExit(when, int(event.number("exit_code", -1.0)))
        elif name == EVENT_WARM_FAILURE and self.warm_failure is None:
            self.warm_failure = WarmLoss(when, int(event.number("rank", 0.0)), int(event.number("exit_code", -1.0)),
                                         str(event.fields.get("what") or ""))

    def _beat(self, rank: int, beat: Heartbeat, seen: float) -> None:
        previous = self.beats.get(rank)
        if previous is None or beat.time >= previous.time:
            self.beats[rank] = RankBeat(beat.time, beat.timeout_s, beat.phase, seen)
        if beat.step > self.last_step:
            self.last_step, self.last_step_heard = beat.step, seen
            if self.first_step_heard is None and beat.phase is None:
                self.first_step_heard = (seen, beat.step)

    def steps_per_s(self, least_span_s: float = 0.2) -> float | None:
        """The attempt's training speed as this controller heard it (its own clock), once it has
        heard steps for ``least_span_s``; None before."""
        if self.first_step_heard is None or self.last_step_heard is None:
            return None
        since, first = self.first_step_heard
        span = self.last_step_heard - since
        return (self.last_step - first) / span if span >= least_span_s and self.last_step > first else None

    def observe_state(self, state: JobState, now: float) -> bool:
        """Note the scheduler's state; True when it changed."""
        if state is JobState.RUNNING and self.running_since is None:
            self.running_since = now
        if self.state is not JobState.SUSPENDED and state is JobState.SUSPENDED:
            self.suspended_at = now
        if self.state is JobState.SUSPENDED and state is not JobState.SUSPENDED:
            self.resumed_at = now
            self.suspended_s += now - (self.suspended_at if self.suspended_at is not None else now)
            self.suspended_at = None
        changed = state is not self.state
        self.state = state
        return changed

    def hang(self, now: float, hang_timeout_s: float) -> FailureSign | None:
        """A rank silent for longer than it allows (see the module doc); the most overdue one."""
        if not self.beats or self.state is JobState.SUSPENDED:
            return None
        origin = self.resumed_at or 0.0

        def heard(beat: RankBeat) -> float:
            return max(beat.time if beat.seen is None else beat.seen, origin)

        def overdue(item: tuple[int, RankBeat]) -> float:
            beat = item[1]
            return now - (heard(beat) + max(hang_timeout_s, beat.allowed_s or 0.0))

        rank, beat = max(self.beats.items(), key=overdue)
        if overdue((rank, beat)) <= 0:
            return None
        silent = now - heard(beat)
        where = f" in its {beat.phase} phase" if beat.phase else ""
        return FailureSign(f"hang: no heartbeat from rank {rank} for {silent:.0f} s{where}", beat.time,
                           "last_heartbeat", rank=rank)

    def stuck_start(self, now: float, start_timeout_s: float) -> FailureSign | None:
        started = self.running_since
        if self.training_started is not None or started is None or self.state is JobState.SUSPENDED:
            return None
        if self.go_at is not None:
            started = max(started, self.go_at)  # the job waited for the go, its ranks not yet launched
        if now - started - self.suspended_s <= start_timeout_s:  # time suspended is no start-up
            return None
        return FailureSign(f"no training step within {start_timeout_s:.0f} s of the job starting", started,
                           "job_running")


def rank_errors(watch: AttemptWatch) -> list[tuple[float, int, str]]:
    """(time, rank, what it died of) for every rank that recorded its error, earliest first."""
    errors = []
    for rank in range(watch.ranks):
        path = watch.paths.rank_error_file(watch.attempt, rank)
        try:
            record = RankError.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        errors.append((record.time, rank, record.error))
    return sorted(errors)


def rank_error_suffix(watch: AttemptWatch) -> str:
    """``; rank R: <what it died of>`` for the first rank whose error is a cause, else ``; rank R
    lost a peer: ...`` (a survivor's word: the rank that died first said nothing), or nothing."""
    errors = rank_errors(watch)
    causes = [(rank, error) for _, rank, error in errors if not is_peer_loss(error)]
    if causes:
        return f"; rank {causes[0][0]}: {causes[0][1]}"
    if errors:
        _, rank, error = errors[0]
        return f"; rank {rank} lost a peer: {error}"
    return ""
