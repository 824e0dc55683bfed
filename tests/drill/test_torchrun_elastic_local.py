"""Issue 27, item 1: restart.strategy elastic, torchrun's own restart (``--max-restarts``) measured
like any other recovery. The plain DDP script (experiments/examples/torchrun_ddp.py) under torchrun;
two of its workers SIGKILLed, one at step 60 and one at step 110: torchrun starts its workers
again in the same job each time, each round is an attempt, and the report's resumed and lost steps
are what the script's own per-step log shows."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import psutil
from step_logs import PIPE_LAG_STEPS, Step, executed

from drills import drill
from faultdrill_cli import campaign_copy

EVERY = 25  # the campaign's --every
KILLS = [{"kind": "kill-rank", "after": {"at_step": 60}, "rank": 1},
         {"kind": "kill-rank", "after": {"at_step": 110}, "rank": 0}]


def _rounds(log: Path) -> list[list[Step]]:
    """The steps rank 0 ran, one list per round of torchrun's workers (one process each)."""
    return [list(steps) for _, steps in itertools.groupby(executed(log), key=lambda step: step.pid)]


def test_torchrun_restarts_its_workers_in_the_job_and_each_round_is_measured(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-torchrun", tmp_path, faults=KILLS,
                                 restart={"strategy": "elastic", "max_restarts": 2, "poll_interval_s": 0.05}),
                   timeout=400)
    [run] = report["runs"]
    run_dir = tmp_path / "work" / "runs" / str(run["run_id"])
    assert run["status"] == "completed" and run["final_step"] == 150, run
    attempts = run["attempts"]
    assert [a["failure_class"] for a in attempts[:2]] == ["RANK_SIGNAL", "RANK_SIGNAL"], attempts
    assert len({a["job_id"] for a in attempts}) == 1, "torchrun restarted its workers in the job: no new job"
    assert [fault["met_step"] for fault in run["faults"]] == [60, 110], run["faults"]

    rounds = _rounds(run_dir / "steps-0.log")
    assert len(rounds) == 3 and len(run["recoveries"]) == 2, (rounds, run["recoveries"])
    for failed, resumed, recovery in zip(rounds[:-1], rounds[1:], run["recoveries"], strict=True):
        newest_checkpoint = max(step.step for step in failed) // EVERY * EVERY
        assert resumed[0].step == newest_checkpoint + 1
        assert recovery["resumed_from_step"] == newest_checkpoint, recovery
        reached = max(step.step for step in failed if step.at <= recovery["fault_at"])
        assert reached - newest_checkpoint - PIPE_LAG_STEPS <= recovery["lost_steps"] <= reached - newest_checkpoint
        assert recovery["state_source"] == "the script's own checkpoint" and recovery["ttr_s"] > 0
        assert max(step.at for step in failed) < resumed[0].at, "a failed round trained on beside the next"

    for attempt, round_steps in enumerate(rounds):
        identities = [json.loads(path.read_text())
                      for path in sorted((run_dir / "attempts" / str(attempt)).glob("rank-[0-9].json"))]
        assert sorted(identity["rank"] for identity in identities) == [0, 1], attempt
        assert round_steps[0].pid in {identity["pid"] for identity in identities}, "each round's workers are its ranks"
    killed = [step.pid for failed in rounds[:2] for step in failed[:1]]
    assert not [pid for pid in killed if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
