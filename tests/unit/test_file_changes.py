"""experiments/file_changes.py and the tails that use it (issue 29, a round's work): a tail of an
events file looks at its file only when the kernel said it was written (inotify), reads what came
before its directory's watch, and falls back to a stat where no watch can be had. Real inotify on
this host's filesystem (tmp_path); the looks are counted."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from experiments import layout
from experiments.file_changes import FileChanges
from experiments.layout import EventRecord, JsonlTail, append_json_line

pytestmark = pytest.mark.unit


@pytest.fixture
def changes() -> FileChanges:
    feed = FileChanges.open()
    if feed is None:
        pytest.skip("no inotify here")
    yield feed
    feed.close()


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every stat and open a tail makes of its file."""
    seen: list[str] = []
    real_stat, real_open = os.stat, os.open

    def stat(path: str, *args: object, **kwargs: object) -> os.stat_result:
        seen.append(str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]  # passed through as given

    def open_(path: str, *args: object, **kwargs: object) -> int:
        seen.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]  # passed through as given

    monkeypatch.setattr(layout.os, "stat", stat)
    monkeypatch.setattr(layout.os, "open", open_)
    return seen


def _tail(path: Path, changes: FileChanges | None) -> JsonlTail[EventRecord]:
    return JsonlTail(path, EventRecord.from_json, stat_first=True, changes=changes)


def test_a_tail_looks_at_its_file_only_once_the_kernel_said_it_was_written(tmp_path: Path, changes: FileChanges,
                                                                           looks: list[str]) -> None:
    events = tmp_path / "events.jsonl"
    append_json_line(events, {"event": "job_start", "time": 1.0})  # before the watch: in no event
    tail = _tail(events, changes)
    assert [record.name for record in tail.read_new()] == ["job_start"]
    looks.clear()
    for _ in range(20):  # rounds with nothing written: not a stat
        changes.drain()
        assert tail.read_new() == []
    assert looks == []
    append_json_line(events, {"event": "first_step", "time": 2.0})
    append_json_line(tmp_path / "other.jsonl", {"event": "x", "time": 2.0})  # another file of the directory
    assert tail.read_new() == [], "not drained yet: the next round's"
    changes.drain()
    assert [record.name for record in tail.read_new()] == ["first_step"]
    changes.drain()
    assert tail.read_new() == []


def test_after_the_kernel_dropped_events_every_tail_looks_again(tmp_path: Path, changes: FileChanges,
                                                                looks: list[str]) -> None:
    events = tmp_path / "events.jsonl"
    tail = _tail(events, changes)
    assert tail.read_new() == []
    with events.open("a") as out:  # written, its event lost with the others (IN_Q_OVERFLOW)
        out.write('{"event": "step_exit", "time": 3.0}\n')
    changes.drain()
    changes._by_path[str(tmp_path)].written.clear()
    changes.generation += 1
    assert [record.name for record in tail.read_new()] == ["step_exit"]


def test_a_directory_made_after_the_tail_is_looked_at_with_a_stat_until_it_is_watched(
        tmp_path: Path, changes: FileChanges, looks: list[str]) -> None:
    """The attempt's directory is made by its job: until then its tail looks with a stat (and asks
    for the watch again); from the round its watch is added, the kernel's word."""
    events = tmp_path / "attempts" / "0" / "events.jsonl"
    tail = _tail(events, changes)
    assert tail.read_new() == [] and not changes.watching(str(events.parent))
    append_json_line(events, {"event": "job_start", "time": 1.0})
    changes.drain()
    assert [record.name for record in tail.read_new()] == ["job_start"]
    assert changes.watching(str(events.parent))
    looks.clear()
    changes.drain()
    assert tail.read_new() == [] and looks == []


def test_the_watch_goes_with_the_last_tail_of_its_directory(tmp_path: Path, changes: FileChanges) -> None:
    first, second = _tail(tmp_path / "a.jsonl", changes), _tail(tmp_path / "b.jsonl", changes)
    first.read_new(), second.read_new()
    assert changes.watching(str(tmp_path))
    del first
    gc.collect()
    assert changes.watching(str(tmp_path)), "the second tail still reads there"
    del second
    gc.collect()
    assert not changes.watching(str(tmp_path)) and changes._by_descriptor == {}


def test_one_directory_under_two_paths_is_watched_once_the_other_looks_with_a_stat(
        tmp_path: Path, changes: FileChanges, looks: list[str]) -> None:
    """The kernel names a directory's events by its first watch's path: the second path's tail
    would never hear of its writes, so it is not watched and looks with a stat."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    first, second = _tail(real / "events.jsonl", changes), _tail(tmp_path / "alias" / "events.jsonl", changes)
    first.read_new(), second.read_new()
    assert changes.watching(str(real)) and not changes.watching(str(tmp_path / "alias"))
    append_json_line(real / "events.jsonl", {"event": "job_start", "time": 1.0})
    changes.drain()
    assert [record.name for record in second.read_new()] == ["job_start"]
    assert [record.name for record in first.read_new()] == ["job_start"]


def test_a_deleted_directory_leaves_its_tails_to_a_stat(tmp_path: Path, changes: FileChanges) -> None:
    directory = tmp_path / "attempt"
    directory.mkdir()
    tail = _tail(directory / "events.jsonl", changes)
    assert tail.read_new() == []
    directory.rmdir()
    changes.drain()
    assert not changes.watching(str(directory))
    directory.mkdir()
    append_json_line(directory / "events.jsonl", {"event": "job_start", "time": 1.0})
    assert [record.name for record in tail.read_new()] == ["job_start"]


def test_a_feed_never_closed_gives_its_descriptor_back_when_collected() -> None:
    """Each controller holds one inotify instance (a user has max_user_instances, 128 by default):
    one that was never closed (a controller that raised) closes it when collected."""
    feed = FileChanges.open()
    if feed is None:
        pytest.skip("no inotify here")
    descriptor = feed._fd
    assert os.readlink(f"/proc/self/fd/{descriptor}") == "anon_inode:inotify"
    del feed
    gc.collect()
    assert not os.path.exists(f"/proc/self/fd/{descriptor}") or os.readlink(f"/proc/self/fd/{descriptor}") != "anon_inode:inotify"


def _kernel_watches(descriptor: int) -> int:
    with open(f"/proc/self/fdinfo/{descriptor}") as info:
        return sum(line.startswith("inotify wd:") for line in info)


def test_a_sweeps_watches_follow_its_runs_in_flight_not_its_finished_runs(tmp_path: Path) -> None:
    """Review of 49e4d89: a finished run kept its attempt directory's watch (its tracker keeps its
    last watch) until the drill ended: a sweep's watches grew with its finished runs against the
    user's max_user_watches (8,192 on kernels before 5.11). Twelve runs, three at a time: never
    more than three directories watched, none once they are done."""
    import yaml

    from fake_scheduler import FakeScheduler, run_completed
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.control.controller import Controller
    from orchestrator.states import JobState

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "watches", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"poll_interval_s": 0.01, "hang_timeout_s": 600},
        "sweep": {"grid": {"workload.seed": list(range(12))}}, "parallel_runs": 3}))
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(spec), backend=scheduler)
    feed = controller.changes
    if feed is None:
        pytest.skip("no inotify here")
    watched: list[int] = []

    def observe(trackers: list, touched: list) -> None:  # type: ignore[type-arg]  # the loop's trackers
        watched.append(_kernel_watches(feed._fd))
        for tracker in trackers:
            watch = tracker.watch
            if watch is not None and scheduler.states.get(watch.job_id) is JobState.PENDING:
                scheduler.states[watch.job_id] = JobState.RUNNING
                run_completed(tracker.run.paths.root, watch.attempt, 100)
            elif watch is not None and scheduler.states.get(watch.job_id) is JobState.RUNNING:
                scheduler.states[watch.job_id] = JobState.COMPLETED

    try:
        assert controller.run(observer=observe)
        gc.collect()
        assert all(tracker.status == "completed" for tracker in controller._trackers)
        assert max(watched) <= 3, watched
        assert feed._by_path == {} and _kernel_watches(feed._fd) == 0
    finally:
        controller.close()


def test_a_directory_renamed_away_and_made_again_is_read(tmp_path: Path, changes: FileChanges) -> None:
    """Review of 49e4d89: the kernel's watch follows the directory, not its path: renamed away, its
    events came under the old path and the new directory's writes were never read."""
    directory = tmp_path / "attempt"
    directory.mkdir()
    tail = _tail(directory / "events.jsonl", changes)
    assert tail.read_new() == []
    directory.rename(tmp_path / "elsewhere")
    directory.mkdir()
    append_json_line(directory / "events.jsonl", {"event": "step_exit", "time": 1.0})
    changes.drain()
    assert [record.name for record in tail.read_new()] == ["step_exit"]


def test_a_directory_deleted_while_held_and_made_again_is_read_within_relook_s(
        tmp_path: Path, changes: FileChanges, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of 49e4d89: a directory deleted while a process holds it sends no event until it lets
    go; the one made at its path in between is read at the latest RELOOK_S later (every tail looks)."""
    import shutil

    from experiments import file_changes

    directory = tmp_path / "attempt"
    directory.mkdir()
    tail = _tail(directory / "events.jsonl", changes)
    assert tail.read_new() == []
    held = os.open(directory, os.O_RDONLY)
    try:
        shutil.rmtree(directory)
        directory.mkdir()
        append_json_line(directory / "events.jsonl", {"event": "step_exit", "time": 1.0})
        changes.drain()
        assert tail.read_new() == []
        later = file_changes.monotonic() + file_changes.RELOOK_S
        monkeypatch.setattr(file_changes, "monotonic", lambda: later)
        changes.drain()
        assert [record.name for record in tail.read_new()] == ["step_exit"]
    finally:
        os.close(held)
