"""What a run under restart.strategy warm must show — PyTorch's spares taking dead ranks' places
with a survivor's state, TensorFlow's and Chainer's whole spare sets restarting every rank — and
that a recovery's phases are the moments recorded for them: shared by the local drills (tests/unit) and the Slurm and PBS
drills (tests/cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recovery_checks import assert_phases_follow_the_moments


def assert_peer_recoveries(run: dict[str, Any], run_dir: Path, faults: int | None = None) -> None:
    """PyTorch under warm: completed bit for bit as its twin, in one job; each fault answered by a
    warm spare and a survivor's state (no rollback: at most the interrupted step redone)."""
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
    assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every re-formation in the same job"
    assert run["recoveries"] and len(run["recoveries"]) == len(run["attempts"]) - 1
    if faults is not None:
        assert len(run["recoveries"]) == faults and all(f["outcome"] == "injected" for f in run["faults"]), run
    for recovery in run["recoveries"]:
        assert recovery["strategy"] == "warm" and recovery["state_source"] == "peer", recovery
        assert recovery["spare"].startswith("slot ") and recovery["lost_steps"] <= 1, recovery
        assert_phases_follow_the_moments(run, recovery, run_dir)


def assert_spare_sets_recovered(run: dict[str, Any], run_dir: Path, faults: int) -> None:
    """Completed bit for bit as its twin, in one job; each fault answered by a whole warm spare set
    (one process per rank, never a slot used twice) from the newest valid checkpoint; every process
    of that set set up and waiting before the rank died (no cold start)."""
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
    assert len(run["faults"]) == faults and all(f["outcome"] == "injected" for f in run["faults"]), run["faults"]
    assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every restart in the same job"
    assert len(run["recoveries"]) == faults == len(run["attempts"]) - 1
    used: set[str] = set()
    for recovery in run["recoveries"]:
        assert recovery["strategy"] == "warm" and recovery["failure_class"] == "RANK_SIGNAL", recovery
        assert recovery["state_source"] == "checkpoint", recovery
        slots = recovery["spare"].split(",")
        assert len(slots) == run["ranks"] and not used & set(slots), recovery
        used |= set(slots)
        assert_phases_follow_the_moments(run, recovery, run_dir)
    plans = restart_plans(run_dir)
    assert len(plans) == faults, plans
    for plan in plans:
        assert all(warm_at < plan["failed_at"] for warm_at in plan["spares_warm_at"].values()), plan


def restart_plans(run_dir: Path) -> list[dict[str, Any]]:
    """The coordinator's plans after a failure (generation > 0), from the attempts' events."""
    events = [json.loads(line) for path in sorted(run_dir.glob("attempts/*/events.jsonl"))
              for line in path.read_text().splitlines() if line.strip()]
    return [event for event in events if event.get("event") == "warm_plan" and event["generation"] > 0]
