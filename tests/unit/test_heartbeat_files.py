"""Heartbeats per attempt (the hardening issue, item 9): a new attempt's watch reads its own
attempt's lines only, and a recovery reads each rank's file from its end back, so neither costs
what the run's age does; the zero-code resume check reads one line per earlier file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import experiments.layout as layout
from experiments.layout import RunPaths, append_json_line, read_json_lines, read_json_lines_backwards
from experiments.runtime.command import trained_before
from orchestrator.observe.watch import AttemptWatch
from orchestrator.record.recovery import last_progress, step_reached_at

pytestmark = pytest.mark.unit


def _beat(paths: RunPaths, rank: int, attempt: int, step: int, at: float) -> None:
    append_json_line(paths.heartbeat_file(attempt, rank), {"attempt": attempt, "step": step, "time": at})


def _long_attempt(paths: RunPaths, attempt: int, steps: int, ranks: int = 2) -> None:
    """``steps`` beats per rank, written at once (as 20000 appends would)."""
    for rank in range(ranks):
        path = paths.heartbeat_file(attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'{{"attempt": {attempt}, "step": {s}, "time": {1000.0 + s * 0.05}}}\n'
                                for s in range(1, steps + 1)))


class _CountingOpen:
    """``open`` for experiments.layout that adds up the bytes its files hand out."""

    def __init__(self) -> None:
        self.bytes_read = 0

    def __call__(self, *args: object, **kwargs: object):
        handle = open(*args, **kwargs)  # noqa: SIM115 (handed to the caller, who closes it)
        counter, read = self, handle.read

        def counted(*read_args: object) -> bytes:
            data = read(*read_args)
            counter.bytes_read += len(data)
            return data
        handle.read = counted
        return handle


def test_a_recovery_reads_the_beats_since_its_resume_step_not_the_runs_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 9 of the hardening issue: an attempt's beats are a file of their own, and a recovery
    reads each from its end back: what it costs follows the checkpoint interval, not the run's age."""
    paths = RunPaths(tmp_path)
    _long_attempt(paths, 0, 20000)  # a long attempt 0 ...
    for step in range(19950, 19991):  # ... and attempt 1, resumed from 19950, killed at 19990
        _beat(paths, 0, 1, step, 3000.0 + step * 0.05)
        _beat(paths, 1, 1, step, 3000.0 + step * 0.05)
    counting = _CountingOpen()
    monkeypatch.setattr(layout, "open", counting, raising=False)
    fault_at = 3000.0 + 19985 * 0.05
    assert last_progress(paths, 2, 1, fault_at) == (19985, 3000.0 + 19985 * 0.05)
    assert step_reached_at(paths, 2, 19950, fault_at) == 3000.0 + 19950 * 0.05
    assert step_reached_at(paths, 2, 19000, fault_at) == 1000.0 + 19000 * 0.05  # attempt 0 reached it
    attempt_0_bytes = paths.heartbeat_file(0, 0).stat().st_size
    assert counting.bytes_read < attempt_0_bytes, "a recovery read a whole long attempt's heartbeats"


def test_heartbeats_read_backwards_are_every_record_in_reverse_across_chunks(tmp_path: Path) -> None:
    path = tmp_path / "beats.jsonl"
    records = [{"step": step, "pad": "x" * (step % 7)} for step in range(300)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + '{"step": 300, "torn')
    assert list(read_json_lines_backwards(path, chunk_bytes=37)) == records[::-1] == read_json_lines(path)[::-1]
    assert list(read_json_lines_backwards(tmp_path / "none.jsonl")) == []


def test_a_new_attempts_watch_reads_nothing_of_the_attempts_before(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    paths = RunPaths(tmp_path)
    _long_attempt(paths, 0, 5000)
    _beat(paths, 0, 1, 4000, 2000.0)
    counting = _CountingOpen()
    monkeypatch.setattr(layout, "open", counting, raising=False)
    watch = AttemptWatch(attempt=1, job_id="2", paths=paths, ranks=2)
    watch.read()
    assert watch.last_step == 4000 and watch.beats[0].time == 2000.0 and 1 not in watch.beats
    assert counting.bytes_read < 200, f"attempt 1's watch read {counting.bytes_read} bytes"


def test_the_zero_code_resume_check_reads_one_line_per_earlier_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    paths = RunPaths(tmp_path)
    assert not trained_before(paths, 1)
    _beat(paths, 0, 0, 0, 10.0)  # attempt 0 never trained
    assert not trained_before(paths, 1)
    _long_attempt(paths, 1, 5000)
    counting = _CountingOpen()
    monkeypatch.setattr(layout, "open", counting, raising=False)
    assert trained_before(paths, 2) and not trained_before(paths, 1)
    assert counting.bytes_read < paths.heartbeat_file(1, 0).stat().st_size


def test_a_run_of_nuls_a_crashed_append_left_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A node that crashed mid-append leaves a zero-filled stretch: json.loads took the bytes for
    UTF-16/32 and raised UnicodeDecodeError, killing the controller at every restart."""
    paths = RunPaths(tmp_path)
    path = paths.heartbeat_file(0, 0)
    append_json_line(path, {"attempt": 0, "step": 5, "time": 100.0})
    with open(path, "ab") as handle:
        handle.write(b"\0" * 64)
    append_json_line(path, {"attempt": 0, "step": 6, "time": 101.0})  # glued to the NULs: lost, as forward
    append_json_line(path, {"attempt": 0, "step": 7, "time": 102.0})
    assert last_progress(paths, 1, 0, 200.0) == (7, 102.0)
    assert step_reached_at(paths, 1, 6, 200.0) == 100.0 and trained_before(paths, 1)
    watch = AttemptWatch(attempt=0, job_id="1", paths=paths, ranks=1)
    watch.read(300.0)
    assert watch.last_step == 7 and [b["step"] for b in read_json_lines(path)] == [5, 7]
