"""Issue 22 item 3: one writer per file. An attempt's events come from the batch script, a command
workload's supervisor, rank 0 and the warm coordinator, on different hosts: over NFS appends from
several clients to one file interleave and are not atomic, so each writes a file of its own and
readers merge them in time order (each writer's own order kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.layout import EventsTail, RunPaths, append_json_line, read_attempt_events
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import parse_campaign
from orchestrator.render.scripts import render_pbs, render_slurm

pytestmark = pytest.mark.unit


def _write(paths: RunPaths) -> None:
    append_json_line(paths.script_events_file(0), {"event": "job_start", "time": 10.0})
    append_json_line(paths.supervisor_events_file(0), {"event": "process_start", "time": 10.5})
    append_json_line(paths.events_file(0), {"event": "checkpoint_loaded", "time": 11.0, "step": 0})
    append_json_line(paths.events_file(0), {"event": "first_step", "time": 12.0, "step": 1})
    append_json_line(paths.coordinator_events_file(0), {"event": "warm_failure", "time": 12.0, "rank": 1})
    append_json_line(paths.script_events_file(0), {"event": "step_exit", "time": 13.0, "exit_code": 0})


def test_every_writers_events_are_read_back_merged_in_time_order(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    _write(paths)
    names = [event.name for event in read_attempt_events(paths, 0)]
    assert names == ["job_start", "process_start", "checkpoint_loaded", "first_step", "warm_failure", "step_exit"]
    assert {path.name for path in paths.attempt_dir(0).iterdir()} == {path.name for path in paths.event_files(0)}


def test_the_tail_of_every_writers_file_gives_what_each_appended_since(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    tail = EventsTail(paths, 0)
    assert tail.read_new() == []
    _write(paths)
    with open(paths.events_file(0), "a") as handle:  # rank 0's line, torn: it waits for its end
        handle.write('{"event": "completed", "ti')
    assert [event.name for event in tail.read_new()][-1] == "step_exit"
    with open(paths.events_file(0), "a") as handle:
        handle.write('me": 14.0}\n')
    assert [event.name for event in tail.read_new()] == ["completed"]


def test_the_batch_scripts_write_their_own_file_never_rank_0s(tmp_path: Path) -> None:
    spec = {"name": "w", "backend": "slurm", "workdir": str(tmp_path / "work"),
            "workload": {"framework": "torch", "params": 1000, "steps": 10},
            "resources": {"nodes": 1, "time": "00:10:00"}}
    [run] = expand_runs(parse_campaign(spec, base_dir=tmp_path))
    slurm = render_slurm(run, attempt=0, drill_id="d").text
    assert f'/{run.paths.script_events_file(0).name}"' in slurm and f"/{run.paths.events_file(0).name}" not in slurm
    [run] = expand_runs(parse_campaign({**spec, "backend": "pbs"}, base_dir=tmp_path))
    pbs = render_pbs(run, attempt=0, drill_id="d", python="python3").text
    assert f"events={run.paths.script_events_file(0)}" in pbs and f"/{run.paths.events_file(0).name}" not in pbs
