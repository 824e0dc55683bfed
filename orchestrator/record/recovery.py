"""Time to recover and work lost, from the ledger and the files a run's ranks wrote.

Phases (DESIGN.md): fault -> detected -> new job accepted -> job started -> framework ready ->
checkpoint loaded -> first step done. Each phase is a difference of two of these wall times, so the
phases add up to ttr_s exactly.

The times come from several clocks: the controller's (detected, accepted: the login clock, the
reference) and the compute nodes' (the fault agent's, the batch script's, rank 0's). Each node
stamp is moved onto the login clock by the offset read from its node while the attempt ran
(orchestrator.record.clocks), and each phase carries the uncertainty of that move: none between two
stamps of one clock, the sum of both bounds across two, unknown (None) where a clock was not read.
Each moment happens after the one before it, so a later moment that still reads earlier (within
the bounds, or on a clock not read) is moved up to the one before it (no phase is ever negative),
and the largest such move is recorded as ``clock_correction_s``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from experiments.layout import (
    EVENT_CHECKPOINT_LOADED,
    EVENT_ELASTIC_ROUND,
    EVENT_FIRST_STEP,
    EVENT_FRAMEWORK_READY,
    EVENT_JOB_START,
    EVENT_PROCESS_START,
    EVENT_STAMPED_ON,
    EVENT_WARM_PLAN,
    EventRecord,
    Heartbeat,
    RunPaths,
    first_event,
    read_attempt_events,
    read_json_lines_backwards,
)
from orchestrator.record.clocks import LOGIN, OnLogin, Stamp, between, load_clocks
from orchestrator.record.ledger import AttemptRow, RecoveryRow
from orchestrator.record.stamps import UNKNOWN_NODE, rank_node, rank_offsets

PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")


@dataclass(frozen=True)
class Failure:
    """What ended an attempt: an injected fault (kind, time it acted) or a natural failure, with
    the evidence its time comes from (fault, step_exit, scheduler_end, last_heartbeat, poll, ...)."""

    kind: str
    at: float
    detected: float
    evidence: str = "fault"
    clock: str = LOGIN  # the clock ``at`` was stamped on: a fault agent's node, the batch host's, the login node's
    detected_clock: str = LOGIN  # warm: the job's coordinator stamps the detection on the batch host


@dataclass(frozen=True)
class AttemptTimeline:
    job_start: float
    framework_ready: float
    checkpoint_loaded: float
    resumed_from_step: int
    first_step: float
    skipped_steps: tuple[int, ...] = ()  # newer checkpoints rank 0 could not use (a fallback)
    batch_host: str = UNKNOWN_NODE  # whose clock stamped job_start (rank 0's start on the local backend)


def attempt_timeline(paths: RunPaths, attempt: int) -> AttemptTimeline | None:
    """The start-up timeline of an attempt, or None until its first training step is done."""
    events = read_attempt_events(paths, attempt)
    first = first_event(events, EVENT_FIRST_STEP)
    ready = first_event(events, EVENT_FRAMEWORK_READY)
    loaded = first_event(events, EVENT_CHECKPOINT_LOADED)
    start = first_event(events, EVENT_JOB_START) or first_event(events, EVENT_PROCESS_START)
    if first is None or ready is None or loaded is None or start is None:
        return None
    return AttemptTimeline(
        job_start=start.time,
        framework_ready=ready.time,
        checkpoint_loaded=loaded.time,
        resumed_from_step=int(loaded.number("step", 0)),
        first_step=first.time,
        skipped_steps=tuple(int(step) for step in loaded.fields.get("skipped") or ()),
        batch_host=str(start.fields.get("node") or UNKNOWN_NODE),
    )


def recovering_from(paths: RunPaths, ran: list[int]) -> int:
    """The failed attempt a recovery counts from, of the attempts that ``ran`` before it (in
    order): the last one, unless it failed before its first step — a restart that recovered
    nothing — so the recovery spans back to the failure before it, which gets its row."""
    failed = ran[-1]
    for earlier in reversed(ran[:-1]):
        if attempt_timeline(paths, failed) is not None:
            break
        failed = earlier
    return failed


def compute_recovery(
    paths: RunPaths, failure: Failure, failed: AttemptRow, resumed: AttemptRow, ranks: int, failed_restarts: int = 0
) -> RecoveryRow | None:
    timeline = attempt_timeline(paths, resumed.attempt)
    if timeline is None or resumed.accepted is None:
        return None
    failed_read = load_clocks(paths.clocks_file(failed.attempt))
    resumed_read = load_clocks(paths.clocks_file(resumed.attempt))
    failed_clocks, resumed_clocks = failed_read.merged_with(resumed_read), resumed_read.merged_with(failed_read)
    failed_at = failed_clocks.on_login(Stamp(failure.at, failure.clock))
    detected = failed_clocks.on_login(Stamp(failure.detected, failure.detected_clock))
    if failure.evidence != "fault" and detected.time < failed_at.time:
        failed_at = detected  # a natural failure is no later than its detection (compared on one clock)
    fault_at = failed_at.time
    last_step, last_time = last_progress(paths, ranks, failed.attempt, fault_at)
    resumed_time = step_reached_at(paths, ranks, timeline.resumed_from_step, fault_at)
    lost_steps = max(0, last_step - timeline.resumed_from_step)
    lost_s = max(0.0, last_time - resumed_time) if lost_steps else 0.0
    resumed_events = read_attempt_events(paths, resumed.attempt)
    plan = first_event(resumed_events, EVENT_WARM_PLAN) or first_event(resumed_events, EVENT_ELASTIC_ROUND)
    # warm: the coordinator's plan is the new attempt's acceptance (the controller records it later);
    # elastic: torchrun's start of the round. Both are stamped in the batch script's job.
    accepted = (Stamp(plan.time, str(plan.fields.get(EVENT_STAMPED_ON) or timeline.batch_host)) if plan is not None
                else Stamp(resumed.accepted, LOGIN))
    rank0 = rank_node(paths, resumed.attempt, 0)
    stamps = [failed_at, detected, resumed_clocks.on_login(accepted),
              resumed_clocks.on_login(Stamp(timeline.job_start, timeline.batch_host)),
              *(resumed_clocks.on_login(Stamp(moment, rank0))
                for moment in (timeline.framework_ready, timeline.checkpoint_loaded, timeline.first_step))]
    moments, correction = ordered([stamp.time for stamp in stamps])
    detect, resubmit, queue, startup, load, first_step = (b - a for a, b in zip(moments, moments[1:], strict=False))
    return RecoveryRow(
        run_id=failed.run_id,
        attempt=resumed.attempt,
        fault_kind=failure.kind,
        # a fault's as it recorded it (its clock: what ties the recovery to its fault); a natural
        # failure's on the login clock
        fault_at=failure.at if failure.evidence == "fault" else fault_at,
        detect_s=detect,
        resubmit_s=resubmit,
        queue_s=queue,
        startup_s=startup,
        load_s=load,
        first_step_s=first_step,
        ttr_s=moments[-1] - moments[0],
        lost_steps=lost_steps,
        lost_s=lost_s,
        lost_rank_s=lost_s * ranks,
        resumed_from_step=timeline.resumed_from_step,
        failure_evidence=failure.evidence,
        clock_correction_s=correction,
        failure_class=failed.failure_class or "",
        class_evidence=failed.class_evidence or "",
        fallback_from_step=max(timeline.skipped_steps, default=None),
        fallback_lost_steps=max(timeline.skipped_steps, default=timeline.resumed_from_step)
        - timeline.resumed_from_step,
        failed_restarts=failed_restarts,
        phase_uncertainty=json.dumps(phase_uncertainty(stamps)),
        clock_offsets=json.dumps({**failed_clocks.offsets_json(), **resumed_clocks.offsets_json()}, sort_keys=True),
        **warm_recovery(plan),
    )


def phase_uncertainty(stamps: list[OnLogin]) -> dict[str, float | None]:
    """Each phase's (and ttr_s's) uncertainty from the clocks of the two moments it lies between."""
    bounds: dict[str, float | None] = {phase: between(a, b)
                                       for phase, a, b in zip(PHASES, stamps[:-1], stamps[1:], strict=True)}
    bounds["ttr_s"] = between(stamps[0], stamps[-1])
    return {phase: None if bound is None else round(bound, 6) for phase, bound in bounds.items()}


def warm_recovery(plan: EventRecord | None) -> dict[str, str | None]:
    """What the warm coordinator did to make an attempt (its plan): the spare used, the state's
    source (elastic: torchrun's round, its state the script's own checkpoint)."""
    if plan is None:
        return {}
    used = plan.fields.get("spares_used", {})
    spares = ",".join(f"slot {slot} as rank {rank}" for slot, rank in sorted(used.items()))
    return {"spare": spares or None, "state_source": str(plan.fields.get("resume"))}


def ordered(moments: list[float]) -> tuple[list[float], float]:
    """Each moment no earlier than the one before it, and the largest move that took."""
    fixed = [moments[0]]
    correction = 0.0
    for moment in moments[1:]:
        correction = max(correction, fixed[-1] - moment)
        fixed.append(max(moment, fixed[-1]))
    return fixed, correction


def _newest_beat(paths: RunPaths, attempt: int, rank: int, before: float, step: int | None = None,
                 earliest_of_its_step: bool = False, offset: float = 0.0) -> Heartbeat | None:
    """The rank's beat of ``attempt`` with the highest step (at most ``step``) at or before
    ``before`` (the login clock's; the beat's own clock is ``offset`` ahead of it, and the beat
    returned is on the login clock): the latest beat of that step, or the earliest. Read from the
    file's end back: a recovery pays for the beats since that step, never for the attempt's age."""
    found: Heartbeat | None = None
    for record in read_json_lines_backwards(paths.heartbeat_file(attempt, rank)):
        try:
            beat = Heartbeat.from_json(record)
        except (KeyError, TypeError, ValueError):
            continue  # not a beat (a torn line's remains)
        beat = replace(beat, time=beat.time - offset)
        if beat.attempt != attempt or beat.time > before or (step is not None and beat.step > step):
            continue
        if found is not None and beat.step != found.step:
            break
        found = beat
        if not earliest_of_its_step:
            break
    return found


def last_progress(paths: RunPaths, ranks: int, attempt: int, before: float) -> tuple[int, float]:
    """The highest step any rank of ``attempt`` reported before ``before``, and when (both times on
    the login clock, each rank's beats moved onto it by its node's reading)."""
    offsets = rank_offsets(paths, attempt, ranks)
    beats = [beat for rank in range(ranks)
             if (beat := _newest_beat(paths, attempt, rank, before, earliest_of_its_step=True, offset=offsets[rank]))]
    if not beats:
        return 0, before
    best = max(beats, key=lambda beat: (beat.step, -beat.time))
    return best.step, best.time


def step_reached_at(paths: RunPaths, ranks: int, step: int, before: float) -> float:
    """When the run reached ``step`` on its way to the failure (the newest attempt that did), on the
    login clock."""
    for attempt in reversed(paths.heartbeat_attempts()):
        offsets = rank_offsets(paths, attempt, ranks)
        beats = [beat for rank in range(ranks) if (beat := _newest_beat(paths, attempt, rank, before, step,
                                                                          offset=offsets[rank]))]
        if beats:
            return max(beats, key=lambda beat: (beat.step, beat.time)).time
    return before
