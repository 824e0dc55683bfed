"""Issue 23, item 3: the live display tells the story. Each event the ledger records is a line as it
comes ("12:03:04 r000 kill-rank -> rank 1@n2 (pid 4711, step 130)", "attempt 0 failed: RANK_SIGNAL,
detected 0.26 s after the fault", "attempt 1 submitted: job 2957", "attempt 1 trains again: first step
6.9 s after the failure, resumed from step 120, 10 steps lost"), each told once; a run's last event
and its age go to `status`; a run with no new step for 50 of its steps (at least 30 s) is stalled."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.control.progress import progress_rows, progress_table
from orchestrator.control.story import STALL_LEAST_S, Story
from orchestrator.record.ledger import FaultRow, Ledger, RecoveryRow

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def _tracker(ledger: Ledger, status: str = "running", step: int = 130, steps_per_s: float | None = 100.0) -> Any:
    """A stand-in for a RunTracker: what the story and the progress rows read of one."""
    watch = SimpleNamespace(attempt=1, job_id="2957", state=SimpleNamespace(value="RUNNING"), last_step=step,
                            steps_per_s=lambda: steps_per_s, last_step_heard=T0 - 1)
    return SimpleNamespace(run=SimpleNamespace(run_id="r000", workload=SimpleNamespace(steps=800)), ledger=ledger,
                           status=status, watch=watch, job_id="2957", faults=SimpleNamespace(sent=1), plan=[object()], queued_unheard=False)


def test_each_event_is_a_line_once_in_the_order_it_came(tmp_path: Path) -> None:
    ledger = Ledger.in_workdir(tmp_path / "work")
    ledger.add_attempt("r000", 0)
    ledger.update_attempt("r000", 0, job_id="2956", accepted=T0 - 10)
    story, tracker = Story(), _tracker(ledger)
    assert story.new_lines([tracker], now=T0) == [_at(T0 - 10, "attempt 0 submitted: job 2956")]
    ledger.add_fault(FaultRow(fault_id=None, run_id="r000", attempt=0, plan_index=0, kind="kill-rank",
                              target="rank 1@n2", signal="SIGKILL", planned_delay_s=1.0, at=T0 + 1, pid=4711, node="n2",
                              outcome="injected", met_step=130))
    ledger.update_attempt("r000", 0, failure_class="RANK_SIGNAL", detected=T0 + 1.26)
    ledger.add_attempt("r000", 1)
    ledger.update_attempt("r000", 1, job_id="2957", accepted=T0 + 1.5)
    ledger.add_recovery(RecoveryRow(run_id="r000", attempt=1, fault_kind="kill-rank", fault_at=T0 + 1, detect_s=0.26,
                                    resubmit_s=0.2, queue_s=0.5, startup_s=5.9, load_s=0.02, first_step_s=0.02,
                                    ttr_s=6.9, lost_steps=10, lost_s=0.1, lost_rank_s=0.2, resumed_from_step=120))
    assert story.new_lines([tracker], now=T0 + 0.1) == [], "the ledger read at most every half second"
    lines = story.new_lines([tracker], now=T0 + 10)
    assert lines == [_at(T0 + 1, "kill-rank -> rank 1@n2 (pid 4711, step 130)"),
                     _at(T0 + 1.26, "attempt 0 failed: RANK_SIGNAL, detected 0.26 s after the fault"),
                     _at(T0 + 1.5, "attempt 1 submitted: job 2957"),
                     _at(T0 + 7.9, "attempt 1 trains again: first step 6.9 s after the failure, resumed from step "
                                   "120, 10 steps lost")], lines
    assert story.new_lines([tracker], now=T0 + 20) == []
    [row] = progress_rows([tracker], story, now=T0 + 20)
    assert row.last_event.startswith("attempt 1 trains again") and row.last_event_at == T0 + 7.9
    ledger.close()


def _at(moment: float, text: str) -> str:
    import time

    return f"{time.strftime('%H:%M:%S', time.localtime(moment))} r000 {text}"


def test_a_run_without_a_new_step_for_50_of_its_steps_is_stalled_and_status_shows_its_last_event(
        tmp_path: Path) -> None:
    ledger = Ledger.in_workdir(tmp_path / "work")
    story, tracker = Story(), _tracker(ledger, step=800, steps_per_s=1.0)  # 1 s a step: stalled after 50 s
    story.new_lines([tracker], now=T0)
    assert progress_rows([tracker], story, now=T0)[0].stalled_s is None
    assert progress_rows([tracker], story, now=T0 + 40)[0].stalled_s is None, "40 s < 50 steps of 1 s"
    [row] = progress_rows([tracker], story, now=T0 + 60)
    assert row.stalled_s == pytest.approx(60.0)
    fast = _tracker(ledger, step=800, steps_per_s=1000.0)
    other = Story()
    other.new_lines([fast], now=T0)
    progress_rows([fast], other, now=T0)
    assert progress_rows([fast], other, now=T0 + STALL_LEAST_S - 1)[0].stalled_s is None, "at least 30 s"
    table = progress_table([row], now=T0 + 60)
    assert "STALLED 60 s" in str(table.columns[5]._cells[0])
    ledger.close()


def test_a_queued_or_starting_attempt_is_no_stall(tmp_path: Path) -> None:
    """Review: every restart whose queue and start-up took 30 s was flagged STALLED (status running
    from the submission, step 0, no pace)."""
    ledger = Ledger.in_workdir(tmp_path / "work")
    story, tracker = Story(), _tracker(ledger, step=0, steps_per_s=None)
    tracker.watch.state = SimpleNamespace(value="PENDING")
    tracker.watch.last_step_heard = None
    story.new_lines([tracker], now=T0)
    progress_rows([tracker], story, now=T0)
    assert progress_rows([tracker], story, now=T0 + 300)[0].stalled_s is None
    tracker.watch.state = SimpleNamespace(value="RUNNING")  # started, no step heard yet: a start-up
    assert progress_rows([tracker], story, now=T0 + 400)[0].stalled_s is None
    ledger.close()


class _CountingLedger:
    """The ledger, with each run's reads counted (faults, attempts, recoveries)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.reads: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.ledger, name)
        if name not in ("faults", "attempts", "recoveries"):
            return method

        def counted(run_id: str) -> Any:
            self.reads[run_id] = self.reads.get(run_id, 0) + 1
            return method(run_id)
        return counted


class _CountingRun(SimpleNamespace):
    """A run whose filled workload is counted each time it is read."""

    reads = 0

    @property
    def workload(self) -> Any:
        self.reads += 1
        return SimpleNamespace(steps=800)


def test_a_rounds_work_for_a_waiting_or_finished_run_is_constant(tmp_path: Path) -> None:
    """Issue 29: a sweep's round costs what its runs in flight cost. Over twenty rounds of the story
    and the progress rows, a run that waits for its turn is never read from the ledger, and one that
    ended is read once, when its end is told (its look after is for a fault's late word, which would
    be a write of its rows: none came); the filled workload of either is not computed again. A run
    in flight is read in each round that wrote its rows (every other round here), in no other."""
    from orchestrator.control.progress import RowBook

    ledger = _CountingLedger(Ledger.in_workdir(tmp_path / "work"))
    trackers = {}
    for run_id, status in (("waiting", "pending"), ("ended", "completed"), ("flying", "running")):
        tracker = _tracker(ledger, status=status)  # type: ignore[arg-type]  # the counting stand-in
        tracker.run = _CountingRun(run_id=run_id)
        tracker.watch = None if status == "pending" else tracker.watch
        trackers[run_id] = tracker
    story = Story()
    book = RowBook(story)
    seen: list[dict[str, tuple[int, int]]] = []
    ledger.ledger.add_attempt("flying", 0)
    for round_ in range(20):
        now = T0 + round_
        if round_ % 2 == 0:  # what a round in flight writes: a state the scheduler gave, a start
            ledger.ledger.update_attempt("flying", 0, state="RUNNING" if round_ % 4 else "PENDING")
        story.new_lines(list(trackers.values()), now=now)
        rows = book.rows(list(trackers.values()), now=now)
        assert [row.run for row in rows] == list(trackers) and rows[1].status == "completed"
        seen.append({run_id: (ledger.reads.get(run_id, 0), tracker.run.reads) for run_id, tracker in trackers.items()})
    assert seen[-1]["waiting"][0] == 0, "a waiting run is not read from the ledger"
    assert seen[-1]["ended"][0] == 3, "an ended run: the read that told its end, 3 queries"
    for run_id in ("waiting", "ended"):
        assert seen[3][run_id] == seen[-1][run_id], (run_id, seen[3][run_id], seen[-1][run_id])
    assert seen[-1]["flying"][0] == 10 * 3, "the run in flight is read when its rows were written, and only then"
    assert seen[-1]["flying"][1] >= 20, "its progress row is built every round"
    ledger.ledger.close()


def test_an_event_read_after_the_end_was_told_reaches_the_runs_row(tmp_path: Path) -> None:
    """The read after a run's end (helper 38): what it finds is told, and the row kept from then on
    shows it (the row was once kept from the round the story settled, without it)."""
    from orchestrator.control.progress import RowBook

    ledger = Ledger.in_workdir(tmp_path / "work")
    tracker = _tracker(ledger, status="completed")
    story = Story()
    book = RowBook(story)
    story.new_lines([tracker], now=T0)
    assert book.rows([tracker], now=T0)[0].last_event == "run completed"
    ledger.add_fault(FaultRow(fault_id=None, run_id="r000", attempt=0, plan_index=0, kind="kill-rank",
                              target="rank 1@n2", signal="SIGKILL", planned_delay_s=1.0, at=T0 + 1, pid=4711, node="n2",
                              outcome="injected", met_step=130))
    assert story.new_lines([tracker], now=T0 + 1) == [_at(T0 + 1, "kill-rank -> rank 1@n2 (pid 4711, step 130)")]
    for now in (T0 + 1, T0 + 2):
        assert book.rows([tracker], now=now)[0].last_event.startswith("kill-rank -> rank 1@n2")
    ledger.close()


def test_a_row_another_process_wrote_is_told_though_this_connection_wrote_nothing(tmp_path: Path) -> None:
    """The story reads a run again only when its rows were written (issue 29); a write through
    another connection (a faultdrill command beside the controller) counts too."""
    ledger = Ledger.in_workdir(tmp_path / "work")
    ledger.add_attempt("r000", 0)
    story, tracker = Story(), _tracker(ledger)
    assert story.new_lines([tracker], now=T0) == []
    beside = Ledger.in_workdir(tmp_path / "work")
    beside.update_attempt("r000", 0, job_id="2956", accepted=T0 + 0.5)
    assert story.new_lines([tracker], now=T0 + 1) == [_at(T0 + 0.5, "attempt 0 submitted: job 2956")]
    beside.close()
    ledger.close()


def _row(run: str, status: str) -> Any:
    from orchestrator.control.progress import ProgressRow

    return ProgressRow(run=run, status=status, attempt=0, job="1", state="RUNNING", step=5, target_steps=10,
                       faults_sent=0, faults_planned=0)


def test_the_progress_of_a_large_sweep_shows_the_runs_under_way_and_counts_the_rest() -> None:
    """Issue 29: ``faultdrill status`` and the live table of 10,000 runs: the runs under way or
    that ended badly by name (at most a terminal's rows), the rest in one row counted by status."""
    from collections import Counter

    from orchestrator.report.answer import TERMINAL_ROWS

    rows = ([_row(f"r{i:05d}", "completed") for i in range(9_000)] + [_row(f"w{i:05d}", "pending") for i in range(980)]
            + [_row(f"x{i:02d}", "running") for i in range(18)] + [_row("f00000", "failed"), _row("g00000", "gave_up")])
    table = progress_table(rows, now=T0)
    names = list(table.columns[0].cells)
    assert len(names) == 20 + 1 and {str(name) for name in names[:-1]} == {row.run for row in rows[-20:]}
    assert str(names[-1]) == "9980 more" and str(list(table.columns[1].cells)[-1]) == "completed 9000, pending 980"
    live = progress_table(rows[-60:], now=T0, counts=Counter(row.status for row in rows))  # the open rows, all counts
    assert len(list(live.columns[0].cells)) == min(TERMINAL_ROWS, 20) + 1
    assert str(list(live.columns[1].cells)[-1]) == "completed 9000, pending 980"


def test_the_progress_file_joins_every_runs_row_and_writes_the_last_word_on_close(tmp_path: Path) -> None:
    """Rows are rebuilt for the runs a round touched only; the file holds every run; a change made
    within the write interval reaches it on close."""
    import json

    from orchestrator.control.progress import ProgressFile

    ledger = Ledger.in_workdir(tmp_path / "work")
    first, second = _tracker(ledger), _tracker(ledger)
    second.run = SimpleNamespace(run_id="r001", workload=SimpleNamespace(steps=800))
    progress = ProgressFile(tmp_path, Story())
    progress([first, second], [first, second])
    assert [run["run"] for run in json.loads((tmp_path / "progress.json").read_text())["runs"]] == ["r000", "r001"]
    second.watch.last_step = 131  # a new step of a run the next round touches, within the interval
    progress([first, second], [second])
    assert json.loads((tmp_path / "progress.json").read_text())["runs"][1]["step"] == 130
    progress.close()
    assert [run["step"] for run in json.loads((tmp_path / "progress.json").read_text())["runs"]] == [130, 131]
    ledger.close()


def test_a_drills_display_and_progress_file_share_one_row_a_round(tmp_path: Path) -> None:
    """Issue 29: the live display and progress.json are one observer (what `faultdrill drill` runs):
    a run in flight's row is built once a round for both (counted: its workload's steps read once a
    row), and the file still gets every change on close."""
    import io
    import json

    from rich.console import Console

    from orchestrator.control.progress import DrillProgress

    ledger = Ledger.in_workdir(tmp_path / "work")
    tracker = _tracker(ledger)
    tracker.run = _CountingRun(run_id="r000")
    progress = DrillProgress(tmp_path, Console(file=io.StringIO()))
    with progress:
        for round_ in range(5):
            tracker.watch.last_step = 130 + round_
            progress([tracker], [tracker])
    progress.close()
    assert tracker.run.reads == 5, "a row built once a round, not once for each of its two readers"
    assert json.loads((tmp_path / "progress.json").read_text())["runs"][0]["step"] == 134
    ledger.close()


def test_a_row_that_changed_in_many_rounds_is_serialized_once_a_write(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29, a round's work: a run in flight has a new step nearly every round; its row is
    compared with the one kept, and serialized when the file is written (once a second), not every
    round; an unchanged row not even then. The file has the last of them."""
    import json

    from orchestrator.control import progress as progress_module
    from orchestrator.control.progress import ProgressFile

    dumps: list[str] = []
    real_dumps = json.dumps
    monkeypatch.setattr(progress_module.json, "dumps", lambda value, *a, **k: dumps.append(value["run"]) or real_dumps(value, *a, **k))
    ledger = Ledger.in_workdir(tmp_path / "work")
    first, second = _tracker(ledger), _tracker(ledger)
    second.run = SimpleNamespace(run_id="r001", workload=SimpleNamespace(steps=800))
    progress = ProgressFile(tmp_path, Story())
    progress([first, second], [first, second])  # the first write: both rows
    assert sorted(dumps) == ["r000", "r001"]
    for step in range(131, 141):  # ten rounds within the write interval, the second run's step each time
        second.watch.last_step = step
        progress([first, second], [first, second])
    assert sorted(dumps) == ["r000", "r001"], "a changed row serialized before the write, or an unchanged one again"
    progress.close()
    assert sorted(dumps) == ["r000", "r001", "r001"]
    assert [run["step"] for run in json.loads((tmp_path / "progress.json").read_text())["runs"]] == [130, 140]
    ledger.close()


def test_a_long_progress_table_names_the_runs_under_way_before_those_that_ended_badly() -> None:
    """Review of issue 29: sixty runs that gave up, first in the sweep, hid the ten still running."""
    rows = ([_row(f"g{i:02d}", "gave_up") for i in range(60)] + [_row(f"c{i:03d}", "completed") for i in range(930)]
            + [_row(f"x{i:02d}", "running") for i in range(10)])
    names = [str(name) for name in progress_table(rows, now=T0).columns[0].cells]
    assert names[:10] == [f"x{i:02d}" for i in range(10)] and len(names) == 50 + 1, names[:12]


def test_a_look_with_more_lines_than_a_terminal_holds_prints_the_first_and_counts_the_rest() -> None:
    """Issue 29: a 10,000-run sweep's arrays are 10,000 'submitted' lines at the first look: the
    terminal gets the first LINES_PER_LOOK and one line counting the others (the ledger has them)."""
    import io

    from rich.console import Console

    from orchestrator.control.progress import LINES_PER_LOOK, Progress

    out = io.StringIO()
    Progress(Console(file=out, width=200)).show([f"12:00:00 r{i:04d} attempt 0 submitted" for i in range(10_000)], [],
                                                 now=0.0)
    printed = out.getvalue().splitlines()
    assert printed[:LINES_PER_LOOK] == [f"12:00:00 r{i:04d} attempt 0 submitted" for i in range(LINES_PER_LOOK)]
    assert len(printed) == LINES_PER_LOOK + 1 and f"{10_000 - LINES_PER_LOOK:,} more events" in printed[-1]
