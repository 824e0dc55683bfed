"""The batch script's events (templates/events.sh.j2), run by bash: a job's start and its step's
exit, each with a moment that JSON reads as seconds since the epoch, from bash 5's clock (no
process started: a sweep's short jobs), under a locale whose decimal mark is a comma, and from
``date`` where bash has no clock of its own (bash 4, RHEL 7). A locale's multibyte decimal mark
(ps_AF's U+066B, of which bash writes the first byte) once made the line unreadable (helper 38)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.render.scripts import render_slurm

pytestmark = pytest.mark.drill  # bash runs the functions


def _functions() -> str:
    campaign = Campaign.model_validate({"name": "events", "backend": "slurm", "workdir": "/w",
                                        "workload": {"framework": "torch", "steps": 10}})
    text = render_slurm(expand_runs(campaign)[0], 0, "d", "/usr/bin/python3").text
    start = text.index("stamp_now() {")
    end = text.index("\n}\n", text.index("record_step_exit() {")) + 3
    return text[start:end]


@pytest.mark.parametrize("clock", ["", "unset EPOCHREALTIME", "unset EPOCHREALTIME; EPOCHREALTIME=1796572093,298878",
                                   "unset EPOCHREALTIME; EPOCHREALTIME=$'1796572093\\xd9298878'"])  # ps_AF's mark
def test_the_job_start_and_step_exit_are_recorded_with_their_moments(tmp_path: Path, clock: str) -> None:
    events = tmp_path / "attempts" / "0" / "script-events.jsonl"
    script = f"{_functions()}\n{clock}\nevents={events}; job_id=77; rc=3\nrecord_job_start\nrecord_step_exit\n"
    before = time.time()
    subprocess.run(["bash", "-c", script], check=True, timeout=30)
    start, exit_ = [json.loads(line) for line in events.read_text().splitlines()]
    assert start["event"] == "job_start" and start["job_id"] == "77" and exit_ == {**exit_, "event": "step_exit",
                                                                                   "exit_code": 3}
    if "1796572093" in clock:
        assert start["time"] == exit_["time"] == 1796572093.298878
    else:
        assert before - 1 <= start["time"] <= exit_["time"] <= time.time() + 1
