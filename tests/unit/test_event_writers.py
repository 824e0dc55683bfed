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


def test_the_jobs_start_is_the_batch_scripts_whichever_writers_file_is_seen_first(tmp_path: Path) -> None:
    """Review of issue 22: rank 0's file may be seen before the script's (NFS shows each file when it
    shows it), and another node's clock may stamp rank 0's start before the script's: the job's
    start is the script's job_start once it is read, rank 0's process_start only until then."""
    from orchestrator.observe.watch import AttemptWatch

    paths = RunPaths(tmp_path)
    watch = AttemptWatch(attempt=0, job_id="7", paths=paths, ranks=1)
    append_json_line(paths.events_file(0), {"event": "process_start", "time": 1001.5})
    watch.read()
    assert (watch.job_started, watch.job_started_by) == (1001.5, "process_start")
    append_json_line(paths.script_events_file(0), {"event": "job_start", "time": 1000.0})
    watch.read()
    assert (watch.job_started, watch.job_started_by) == (1000.0, "job_start")

    skewed = RunPaths(tmp_path / "skewed")
    append_json_line(skewed.script_events_file(0), {"event": "job_start", "time": 1000.9})  # its node is ahead
    append_json_line(skewed.events_file(0), {"event": "process_start", "time": 1000.6})
    watch = AttemptWatch(attempt=0, job_id="7", paths=skewed, ranks=1)
    watch.read()
    assert watch.job_started == 1000.9, "the script's start, not rank 0's on another clock"


def test_a_writers_own_order_stands_when_it_stamps_an_earlier_moment_later(tmp_path: Path) -> None:
    """Review: the coordinator writes a rank's death with the moment it died, after events it wrote
    since; merging by time must not reorder one writer's file."""
    paths = RunPaths(tmp_path)
    append_json_line(paths.coordinator_events_file(0), {"event": "warm_formed", "time": 20.0})
    append_json_line(paths.coordinator_events_file(0), {"event": "warm_failure", "time": 19.5, "rank": 1})
    append_json_line(paths.events_file(0), {"event": "first_step", "time": 10.0, "step": 1})
    assert [event.name for event in read_attempt_events(paths, 0)] == ["first_step", "warm_formed", "warm_failure"]


@pytest.mark.parametrize(("workload", "strategy", "files"), [
    ({"framework": "torch", "params": 1000, "steps": 10}, "resubmit", {"script-events.jsonl", "events.jsonl"}),
    ({"framework": "torch", "params": 1000, "steps": 10}, "warm",
     {"script-events.jsonl", "events.jsonl", "coordinator-events.jsonl"}),
    ({"framework": "other", "steps": 10, "command": ["sh", "-c", "true"], "progress": {"log": r"^step (\d+)"}},
     "resubmit", {"script-events.jsonl", "events.jsonl", "supervisor-events.jsonl"}),
])
def test_a_runs_watch_opens_each_round_only_the_events_files_its_writers_make(
        tmp_path: Path, workload: dict, strategy: str, files: set[str]) -> None:
    """Issue 29: every round opened four events files for each run in flight, the coordinator's of a
    run with no coordinator, the supervisor's of a built-in workload: their opens were a third of a
    round's reads."""
    from orchestrator.observe.watch import AttemptWatch

    spec = {"name": "w", "backend": "slurm", "workdir": str(tmp_path / "work"), "workload": workload,
            "resources": {"nodes": 1, "time": "00:10:00"}, "restart": {"strategy": strategy}}
    [run] = expand_runs(parse_campaign(spec, base_dir=tmp_path))
    watch = AttemptWatch(attempt=0, job_id="1", paths=run.paths, ranks=run.ranks, event_writers=run.event_writers)
    assert {tail.path.name for tail in watch.events.tails} == files
    assert len(AttemptWatch(attempt=0, job_id="1", paths=run.paths, ranks=1).events.tails) == 4  # unsaid: all


@pytest.mark.parametrize("stat_first", [True, False])
def test_on_this_hosts_filesystem_a_round_opens_only_the_files_that_grew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stat_first: bool) -> None:
    """Issue 29: a round opened every file of every run in flight, grown or not (three syscalls
    each). On this host's own filesystem a stat says whether it grew; elsewhere (NFS) the open is
    what shows another node's appends, so every file is opened each round as before."""
    import os

    from orchestrator.observe.watch import AttemptWatch

    paths = RunPaths(tmp_path)
    _write(paths)
    append_json_line(paths.heartbeat_file(0, 0), {"attempt": 0, "step": 1, "time": 12.0})
    watch = AttemptWatch(attempt=0, job_id="7", paths=paths, ranks=2, stat_first=stat_first)
    watch.read()  # all that was written so far
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: object, *args: object, **kwargs: object) -> int:
        opened.append(os.path.basename(str(path)))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]  # os.open's own overloads

    monkeypatch.setattr(os, "open", counting_open)
    watch.read()  # nothing grew: 4 events files, the checkpoint log, 2 heartbeats (rank 1's missing)
    assert len(opened) == (0 if stat_first else 7), opened
    opened.clear()
    append_json_line(paths.heartbeat_file(0, 0), {"attempt": 0, "step": 2, "time": 12.2})
    opened.clear()  # the append's own open
    watch.read()
    assert watch.last_step == 2
    assert (opened == ["rank-0.jsonl"]) if stat_first else len(opened) == 7, opened


def test_events_of_one_writer_are_taken_as_written_and_of_several_merged_by_time() -> None:
    """Issue 29, a round's work: a watch reads four writers' files a round, most with nothing new;
    the one that wrote is taken as it is (no merge, a list of its own), several merged by time with
    each writer's order kept (a writer's later event stamped earlier stays after its earlier one)."""
    from experiments.layout import EventRecord, by_time

    def event(name: str, at: float) -> EventRecord:
        return EventRecord(name, at, {"event": name, "time": at})

    batch = [event("job_start", 5.0), event("step_exit", 3.0)]
    merged = by_time([[], batch, [], []])
    assert merged == batch and merged is not batch
    assert by_time([[], []]) == []
    rank = [event("first_step", 4.0)]
    assert [e.name for e in by_time([batch, rank, []])] == ["first_step", "job_start", "step_exit"]


def test_with_the_kernels_word_a_round_looks_at_no_events_file_that_was_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a run in flight's four events files are written a few times an attempt, yet each
    was looked at (a stat) every round. With the controller's change feed (inotify) a round looks at
    its heartbeat files and the checkpoint log only, and at an events file once the kernel said it
    was written; the step_exit is read in the round after its drain."""
    import os

    from experiments import layout
    from experiments.file_changes import FileChanges
    from orchestrator.observe.watch import AttemptWatch

    changes = FileChanges.open()
    if changes is None:
        pytest.skip("no inotify here")
    paths = RunPaths(tmp_path)
    _write(paths)
    watch = AttemptWatch(attempt=0, job_id="7", paths=paths, ranks=2, stat_first=True, changes=changes)
    watch.read()  # all that was written so far (each file looked at once: the watch is new)
    looked: list[str] = []
    real_stat = os.stat

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        looked.append(os.path.basename(str(path)))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]  # os.stat's own overloads

    monkeypatch.setattr(layout.os, "stat", counting_stat)
    for _ in range(5):
        changes.drain()
        watch.read()
    tailed = {name for name in looked if name.endswith(".jsonl")}  # (rank-1's identity file is looked for too)
    assert sorted(tailed) == ["checkpoints.jsonl", "rank-0.jsonl", "rank-1.jsonl"], looked
    looked.clear()
    append_json_line(paths.script_events_file(0), {"event": "step_exit", "time": 20.0, "exit_code": 137})
    changes.drain()
    watch.read()
    assert watch.step_exit is not None and watch.step_exit.exit_code == 137
    assert [name for name in looked if "events" in name] == [paths.script_events_file(0).name], looked
    changes.close()
