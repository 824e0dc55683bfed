"""Issue 29: a round's observations of every run in flight (the scheduler's new state, a start)
commit together, once, not once per run and change (each commit an fsync: a 300-run sweep's state
notes took 14 s of a 47 s drill); the decisions still commit on their own, before they act."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_scheduler import FakeScheduler
from orchestrator.campaign.spec import load_campaign
from orchestrator.control.controller import Controller
from orchestrator.states import JobState

pytestmark = pytest.mark.unit


def _spec(tmp_path: Path) -> Path:
    spec = {
        "name": "round-commits", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"poll_interval_s": 0.01, "hang_timeout_s": 600},
        "sweep": {"grid": {"workload.seed": [1, 2, 3]}}, "parallel_runs": 3,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class _Commits:
    """The ledger's commits that wrote something, from its SQL as SQLite runs it: each COMMIT after a
    write, and each write outside a transaction (it commits on its own)."""

    def __init__(self) -> None:
        self.count = 0
        self._inside = self._wrote = False

    def __call__(self, statement: str) -> None:
        word = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
        if word == "BEGIN":
            self._inside, self._wrote = True, False
        elif word in ("COMMIT", "END"):
            self.count += self._wrote
            self._inside = False
        elif word in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
            self._wrote = True
            self.count += not self._inside


def test_the_rounds_observations_of_three_runs_commit_once(tmp_path: Path) -> None:
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(_spec(tmp_path)), backend=scheduler)
    commits = _Commits()
    controller.ledger._db.set_trace_callback(commits)  # the ledger's own connection: what it commits
    per_round: list[tuple[int, int]] = []  # (jobs running, commits in the round)

    def observe(trackers: list[Any], touched: list[Any]) -> None:
        running = sum(state is JobState.RUNNING for state in scheduler.states.values())
        per_round.append((running, commits.count))
        commits.count = 0
        if len(scheduler.states) == 3 and not running:
            for job in scheduler.states:  # every job starts at once: the next round notes three changes
                scheduler.states[job] = JobState.RUNNING
        if len(per_round) > 6:
            controller.stop_requested.set()

    try:
        controller.run(observer=observe)
        states = [attempt.state for run in controller.runs for attempt in controller.ledger.attempts(run.run_id)]
    finally:
        controller.close()
    started = next(index for index, (running, _) in enumerate(per_round) if running == 3)
    assert per_round[started][1] == 1, per_round  # three RUNNING notes, one commit
    assert states == ["RUNNING"] * 3
