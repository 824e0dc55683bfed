"""A recovery's phases checked against the moments recorded apart from it: the fault's moment from
the injector's record, detection from the ledger's end of the failed attempt, acceptance and the
job's start from the ledger (warm: the coordinator's plan), the first step from rank 0's events.
(That the phases are >= 0 and add up to the time to recover holds by construction: consecutive
differences of moments put in order. What can be wrong is which moments they are.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.layout import EVENT_FIRST_STEP, EVENT_WARM_PLAN, RunPaths, attempt_event_lines

TOLERANCE_S = 1e-3  # the report rounds nothing; JSON floats and ledger REALs agree to far better


def _event_time(paths: RunPaths, attempt: int, event: str) -> float | None:
    return next((float(e["time"]) for e in attempt_event_lines(paths, attempt) if e["event"] == event), None)


def _failed_attempt(attempts: list[dict[str, Any]], resumed: int, failed_restarts: int) -> dict[str, Any]:
    """The attempt whose failure ``resumed`` recovers from: back past the restarts that failed before
    their first step; attempts that never reached the scheduler are no restarts (the tracker's count)."""
    ran = [attempt for attempt in attempts[:resumed] if attempt["job_id"] and attempt["state"] != "SUBMIT_FAILED"]
    return ran[-1 - failed_restarts]


def _clock_slack(recovery: dict[str, Any]) -> float:
    """How far the report moved a node's stamp onto the login clock: the largest offset it applied
    (0 on the local backend's one clock; a few ms between the local cluster's nodes, one kernel)."""
    return max((abs(offset) for offset, _ in recovery["clock_offsets"].values()), default=0.0)


def assert_phases_follow_the_moments(run: dict[str, Any], recovery: dict[str, Any], run_dir: Path) -> None:
    """Each phase boundary of ``recovery`` is the moment recorded for it, moved onto the login clock
    by its node's offset (or, where a clock put that moment before the previous boundary, the
    previous boundary: the correction the report names)."""
    paths = RunPaths(run_dir)
    tolerance = TOLERANCE_S + _clock_slack(recovery)
    attempts = run["attempts"]
    resumed = recovery["attempt"]
    failed = _failed_attempt(attempts, resumed, recovery["failed_restarts"])
    start = recovery["fault_at"]
    if recovery["failure_evidence"] == "fault":
        injected = [f["at"] for f in run["faults"] if f["outcome"] == "injected"]
        assert any(abs(start - at) < tolerance for at in injected), (start, injected)
    warm = recovery.get("state_source") is not None
    recorded = [
        None if warm else failed["ended"],  # detection: the controller's record (warm: the coordinator's, below)
        _event_time(paths, resumed, EVENT_WARM_PLAN) if warm else attempts[resumed]["accepted"],
        attempts[resumed]["started"],
        None, None,  # framework ready, checkpoint loaded: rank 0's events, between the two around them
        _event_time(paths, resumed, EVENT_FIRST_STEP),
    ]
    phases = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")
    boundary = start
    for phase, moment in zip(phases, recorded, strict=True):
        before, boundary = boundary, boundary + recovery[phase]
        if moment is not None:
            assert abs(boundary - max(moment, before)) < tolerance, (
                f"{phase} ends at {boundary:.6f}, recorded {moment:.6f}", recovery, failed)
    assert abs(boundary - start - recovery["ttr_s"]) < TOLERANCE_S
    if warm:  # the coordinator saw the failure before the controller recorded it
        assert start + recovery["detect_s"] <= failed["ended"] + tolerance, (recovery, failed)
