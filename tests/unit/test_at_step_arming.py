"""Kills on time (issue 27, item 4): an at_step fault on ranks is sent ahead of its step and acts on
the node when the attempt's heartbeats show it. The controller's poll and the agent's start (a
second under srun) once put a kill 122 steps past its planned step on the Slurm cluster, and a kill
planned 0.55 s after the first checkpoint after the last step of a fast run."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Iterator

import pytest
from clocks import ManualClock

from experiments.layout import RunPaths, append_json_line, read_json_lines
from experiments.runtime.heartbeat import HeartbeatWriter
from injectors.kinds.base import FaultOutcome, FaultTask
from injectors.kinds.moment import wait_for_step
from injectors.kinds.requests import JobEnding
from injectors.schedule import PlannedFault
from injectors.targets import StepNotReached, TargetRefused, VerifiedTarget
from orchestrator.faults.book import INJECTED, NOT_FIRED, SENDING, FaultBook
from orchestrator.observe.watch import AttemptWatch
from orchestrator.record.ledger import Ledger
from orchestrator.states import JobState


def test_the_first_beat_at_or_past_a_faults_step_is_written_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "rank-0.jsonl"
    writer = HeartbeatWriter(path, attempt=0, interval_s=1.0, clock=clock, fault_steps=(7, 4))
    for step in range(0, 10):
        writer.beat(step)
        clock.now += 0.1
    # Rate-limited to 1 s, but step 4 and step 7 (each the first beat at its fault's step) land.
    assert [line["step"] for line in read_json_lines(path)] == [0, 4, 7]


def test_a_fault_step_skipped_by_the_log_is_written_at_the_first_step_past_it(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "rank-0.jsonl"
    writer = HeartbeatWriter(path, attempt=0, interval_s=1.0, clock=clock, fault_steps=(15,))
    for step in (0, 10, 20, 30):  # a script that logs every 10 steps
        writer.beat(step)
        clock.now += 0.1
    assert [line["step"] for line in read_json_lines(path)] == [0, 20]


# the controller: when the agent is sent ---------------------------------------------------------
def _watch(tmp_path: Path, registered: bool) -> AttemptWatch:
    paths = RunPaths(tmp_path / "run")
    watch = AttemptWatch(attempt=0, job_id="j1", paths=paths, ranks=2)
    watch.state = JobState.RUNNING
    if registered:
        for rank in range(2):
            paths.rank_file(0, rank).parent.mkdir(parents=True, exist_ok=True)
            paths.rank_file(0, rank).write_text("{}")
    return watch


def _beats(watch: AttemptWatch, *steps_at: tuple[int, float]) -> None:
    for step, at in steps_at:
        append_json_line(watch.paths.heartbeat_file(0, 0), {"attempt": 0, "step": step, "time": at})
        watch.read(now=at)


def _kill_at(step: int, kind: str = "kill-rank") -> PlannedFault:
    return PlannedFault(index=0, kind=kind, delay_s=0.0, anchor="training_start", at_step=step, ranks=(1,),
                        options={"signal": "SIGKILL"} if kind == "kill-rank" else {})


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


class Agent:
    """The act callback: answers from a list (an outcome, or an exception to raise), counting calls."""

    def __init__(self, *answers: FaultOutcome | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, attempt: int, job_id: str, fault: PlannedFault, on_acted: object) -> FaultOutcome:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _book(tmp_path: Path, pool: ThreadPoolExecutor, fault: PlannedFault, agent: Agent) -> tuple[FaultBook, Ledger]:
    ledger = Ledger.in_workdir(tmp_path)
    return FaultBook("r000", [fault], ledger, pool, act=agent), ledger


def _settle(book: FaultBook, watch: AttemptWatch) -> None:
    assert book.in_flight is not None
    wait([book.in_flight.future], timeout=10)
    book.collect(watch)


def test_a_rank_fault_is_sent_once_the_ranks_registered_while_the_speed_is_unknown(tmp_path: Path, pool) -> None:
    agent = Agent(FaultOutcome(kind="kill-rank", target="rank 1@n1", at=time.time()))
    book, ledger = _book(tmp_path, pool, _kill_at(500), agent)
    try:
        watch = _watch(tmp_path, registered=False)
        book.maybe_fire(watch, time.time())
        assert book.in_flight is None, "sent before its targets had registered (the agent verifies them)"
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        assert book.in_flight is not None and book.in_flight.fault.at_step == 500
    finally:
        ledger.close()


def test_a_known_speed_holds_the_agent_until_the_step_is_near(tmp_path: Path, pool) -> None:
    agent = Agent(FaultOutcome(kind="kill-rank", target="rank 1@n1", at=time.time()))
    book, ledger = _book(tmp_path, pool, _kill_at(500), agent)
    try:
        watch = _watch(tmp_path, registered=True)
        _beats(watch, (1, 100.0), (11, 101.0))  # 10 steps a second: step 500 is 49 s away
        book.maybe_fire(watch, 101.0)
        assert book.in_flight is None
        _beats(watch, (475, 147.4))  # 2.5 s away at that speed: within the lead
        book.maybe_fire(watch, 147.4)
        assert book.in_flight is not None
    finally:
        ledger.close()


def test_a_fault_the_controller_acts_out_waits_for_its_step(tmp_path: Path, pool) -> None:
    """corrupt-checkpoint acts from the controller, at once: no agent to send ahead."""
    book, ledger = _book(tmp_path, pool, _kill_at(50, kind="corrupt-checkpoint"), Agent())
    try:
        watch = _watch(tmp_path, registered=True)
        book.maybe_fire(watch, time.time())
        assert book.in_flight is None
    finally:
        ledger.close()


def test_an_agent_that_came_back_short_of_its_step_is_sent_again_on_the_same_row(tmp_path: Path, pool) -> None:
    agent = Agent(StepNotReached("at step 3 after 30 s"), FaultOutcome(kind="kill-rank", target="rank 1@n1",
                                                                        at=time.time(), signal="SIGKILL"))
    book, ledger = _book(tmp_path, pool, _kill_at(500), agent)
    try:
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        _settle(book, watch)
        [row] = ledger.faults("r000")
        assert row.outcome == SENDING and book.rearm == row.fault_id
        book.maybe_fire(watch, time.time())  # the speed still unknown: sent again at once
        _settle(book, watch)
        [row] = ledger.faults("r000")
        assert agent.calls == 2 and row.outcome == INJECTED and row.planned_step == 500
    finally:
        ledger.close()


def test_a_run_that_ends_while_its_fault_waits_to_be_sent_again_records_it_not_fired(tmp_path: Path, pool) -> None:
    book, ledger = _book(tmp_path, pool, _kill_at(500), Agent(StepNotReached("short")))
    try:
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        _settle(book, watch)
        book.finish("completed", last_attempt=0)
        [row] = ledger.faults("r000")
        assert row.outcome == NOT_FIRED and "waited for its step" in (row.detail or "")
    finally:
        ledger.close()


def test_a_kill_still_waiting_for_its_step_has_sent_no_signal(tmp_path: Path, pool) -> None:
    """A failure of the attempt while the agent waits is not the kill's (the class would say
    RANK_SIGNAL for another cause)."""
    gate: Future[FaultOutcome] = Future()
    book, ledger = _book(tmp_path, pool, _kill_at(500), Agent())
    book.act = lambda *args: gate.result(timeout=10)
    try:
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        assert book.signalled(0, last_step=120) is None
        assert book.signalled(0, last_step=500) == "SIGKILL"
    finally:
        gate.set_result(FaultOutcome(kind="kill-rank", target="rank 1@n1", at=time.time()))
        ledger.close()


# the agent: waiting on the node ------------------------------------------------------------------
def _target(process: subprocess.Popen[bytes], rank: int = 1) -> VerifiedTarget:
    return VerifiedTarget(pid=process.pid, rank=rank, node="n1", job_id="j1", pidfd=os.pidfd_open(process.pid))


def _task(tmp_path: Path, at_step: int, wait_s: float = 10.0) -> FaultTask:
    return FaultTask(kind="kill-rank", run_dir=tmp_path, run_id="r000", attempt=0, job_id="j1", ranks=(1,),
                     at_step=at_step, wait_s=wait_s)


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.drill
def test_the_agent_acts_on_the_beat_that_shows_the_step(tmp_path: Path, rank) -> None:
    paths = RunPaths(tmp_path)
    beats = paths.heartbeat_file(0, 1)
    beats.parent.mkdir(parents=True)
    append_json_line(beats, {"attempt": 0, "step": 3, "time": time.time()})

    def train() -> None:
        for step in range(4, 60):
            time.sleep(0.02)
            append_json_line(beats, {"attempt": 1, "step": step + 1000, "time": time.time()})  # another attempt's
            append_json_line(beats, {"attempt": 0, "step": step, "time": time.time()})

    writer = threading.Thread(target=train)
    writer.start()
    try:
        seen = wait_for_step(_task(tmp_path, at_step=40), [_target(rank)], JobEnding())
        written = max(line["step"] for line in read_json_lines(beats) if line["attempt"] == 0)
    finally:
        writer.join()
    assert seen == 40 and written - seen <= 1, (seen, written)


@pytest.mark.drill
def test_the_agent_reads_every_file_of_the_attempt_where_its_target_writes_none(tmp_path: Path, rank) -> None:
    """torchrun: one heartbeat file per node (its first worker's); the target is rank 1."""
    beats = RunPaths(tmp_path).heartbeat_file(0, 0)
    beats.parent.mkdir(parents=True)
    append_json_line(beats, {"attempt": 0, "step": 41, "time": time.time()})
    assert wait_for_step(_task(tmp_path, at_step=40), [_target(rank)], JobEnding()) == 41


@pytest.mark.drill
def test_a_target_that_ends_before_the_step_makes_the_fault_gone(tmp_path: Path, rank) -> None:
    target = _target(rank)
    threading.Timer(0.2, lambda: (rank.kill(), rank.wait())).start()  # its parent reaps it, as srun does
    with pytest.raises(TargetRefused) as refused:
        wait_for_step(_task(tmp_path, at_step=40), [target], JobEnding())
    assert refused.value.gone and not isinstance(refused.value, StepNotReached)


@pytest.mark.drill
def test_an_agent_that_waited_its_time_says_not_reached(tmp_path: Path, rank) -> None:
    started = time.monotonic()
    with pytest.raises(StepNotReached):
        wait_for_step(_task(tmp_path, at_step=40, wait_s=0.3), [_target(rank)], JobEnding())
    assert time.monotonic() - started < 5


def test_a_controller_started_again_sends_a_fault_whose_agent_came_back_short_of_its_step(
        tmp_path: Path, pool) -> None:
    """Review: the re-send was only in memory; a controller started again took the row for an agent
    still acting (unknown), never sent the fault, and held every later fault out of the attempt."""
    agent = Agent(StepNotReached("short"), FaultOutcome(kind="kill-rank", target="rank 1@n1", at=time.time()))
    book, ledger = _book(tmp_path, pool, _kill_at(500), agent)
    try:
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        _settle(book, watch)
        again = FaultBook("r000", [_kill_at(500)], ledger, pool, act=agent)  # the controller started again
        [row] = ledger.faults("r000")
        assert row.outcome == SENDING and again.blocked_through is None and again.rearm == row.fault_id
        again.maybe_fire(watch, time.time())
        _settle(again, watch)
        [row] = ledger.faults("r000")
        assert agent.calls == 2 and row.outcome == INJECTED
    finally:
        ledger.close()


def test_a_node_whose_agent_came_back_short_does_not_undo_another_nodes_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: two nodes' agents each wait for the step from their own start; one ran out of time a
    moment before the step and the other killed: the kill was thrown away and the row sent again."""
    from types import SimpleNamespace

    from orchestrator.faults import inject

    monkeypatch.setattr(inject, "read_identity", lambda run_dir, attempt, rank: SimpleNamespace(node=f"n{rank}"))

    def on_node(backend: object, request: object, node: str, task: FaultTask, timeout_s: float) -> FaultOutcome:
        if node == "n0":
            return FaultOutcome(kind="kill-rank", target="rank 0@n0", at=time.time(), node="n0", signal="SIGKILL")
        raise StepNotReached("the attempt was at step 59 after 30 s, short of step 60")

    monkeypatch.setattr(inject, "_on_node", on_node)
    run = SimpleNamespace(paths=RunPaths(Path("/nonexistent")), run_id="r000")
    fault = PlannedFault(index=0, kind="kill-rank", delay_s=0.0, anchor="training_start", at_step=60, ranks=(0, 1),
                         options={"signal": "SIGKILL"})
    request = inject.FaultRequest(run=run, attempt=0, job_id="j1", fault=fault)  # type: ignore[arg-type]  # a stand-in run
    outcome = inject.inject(SimpleNamespace(agent_job_id=lambda job: job), request)  # type: ignore[arg-type]  # no backend call
    assert outcome.target.startswith("rank 0@n0") and "short of step 60" in outcome.detail


def test_the_step_an_agent_met_is_recorded_as_it_saw_it(tmp_path: Path, pool) -> None:
    """Review: the met step was rebuilt from heartbeat times up to the agent's clock; an agent reading
    another node's file 0.3 s apart in clocks made step 60 into step 10."""
    from orchestrator.faults.book import RunProgress
    from orchestrator.observe.watch import FailureSign

    agent = Agent(FaultOutcome(kind="kill-rank", target="rank 1@n1", at=time.time(), signal="SIGKILL", met_step=60))
    ledger = Ledger.in_workdir(tmp_path)
    book = FaultBook("r000", [_kill_at(60)], ledger, pool, act=agent,
                     progress=RunProgress(lambda attempt, at: 10, last_step=400))  # what the clocks would say
    try:
        watch = _watch(tmp_path, registered=True)
        watch.read()
        book.maybe_fire(watch, time.time())
        _settle(book, watch)
        book.attempt_ended(0, FailureSign("rank 1 lost", time.time() + 1, "step_exit"), completed=False)
        [row] = ledger.faults("r000")
        assert row.met_step == 60, row
    finally:
        ledger.close()
