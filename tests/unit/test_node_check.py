"""Issue 24, goal 2: a silent node is checked, in two steps: every node's scheduler daemon is asked
for a connection (an up node accepts however busy it is), then a step is started on the quiet nodes
whose daemon did not accept, beside a reference whose daemon did. A node is lost where the scheduler
said it could not reach it, or where no step started on it within the timeout (or a few times the
reference's time) while its daemon did not accept and another's did: a slow step start never loses
a live node. Lost once a poll asked after the silence began still says the job runs; dated to the
node's last beat. A small job's steps start beside the daemons' ask (every quiet node's); quiet nodes
whose daemons all accept are alive, and the next silence is checked only when twice as long; a refusal of the scheduler's own, or a check that could
not be made, proves nothing. Silence is measured against the attempt's pace and heartbeat interval,
never inside a long phase."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from orchestrator.backends.base import NodeAnswer
from orchestrator.observe import node_check
from orchestrator.observe.node_check import NODE_CHECK_EVIDENCE, NodeChecks
from orchestrator.observe.watch import RankBeat
from orchestrator.states import JobState

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
DEAD = NodeAnswer(False, "no step started on it within 3 s", timed_out=True)
UNREACHABLE = NodeAnswer(False, "a step on it failed (exit 1: Communication connection failure)", failed=True)
REFUSED = NodeAnswer(False, "a step on it failed (exit 1: Job/step already completing or completed)")
ALIVE = NodeAnswer(True, "a step on it ran in 0.07 s")


class _Inline:
    """A CheckPool that runs each check at once (the controller's runs it on a thread); ``early``:
    whether it has threads free for a small job's early steps."""

    def __init__(self, early: bool = True) -> None:
        self.early = early

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done

    def submit_early(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> "list[Future[Any]] | None":
        return [self.submit(fn, *args) for args in calls] if self.early else None


class _HeldAsk(_Inline):
    """As _Inline, but the daemons' ask stays under way until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        if fn is not node_check._daemons:
            return super().submit(fn, *args)
        pending: Future[Any] = Future()
        self.held.append((pending, fn, args))
        return pending

    def release(self) -> None:
        for pending, fn, args in self.held:
            pending.set_result(fn(*args))


class _Backend:
    """Each node's step check answers as ``answers`` says (ALIVE unless named); its daemon accepts a
    connection unless ``daemons`` says otherwise, or its step's answer is DEAD or UNREACHABLE."""

    def __init__(self, answers: dict[str, NodeAnswer | Exception], daemons: dict[str, bool | None] | None = None) -> None:
        self.answers = answers
        self.daemons = daemons or {}
        self.asked: list[str] = []
        self.daemons_asked: list[list[str]] = []

    def daemons_accept(self, job_id: str, nodes: list[str], timeout_s: float) -> dict[str, bool | None]:
        self.daemons_asked.append(list(nodes))
        return {node: self.daemons.get(node, self.answers.get(node) not in (DEAD, UNREACHABLE)) for node in nodes}

    def node_answers(self, job_id: str, node: str, timeout_s: float) -> NodeAnswer:
        self.asked.append(node)
        answer = self.answers.get(node, ALIVE)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _watch(beats: dict[int, float], pace: float | None = 20.0, allowed: float | None = None) -> Any:
    return SimpleNamespace(attempt=0, job_id="77", state=JobState.RUNNING, steps_per_s=lambda: pace,
                           beats={rank: RankBeat(at - 0.01, allowed, None, at) for rank, at in beats.items()})


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., tuple[NodeChecks, _Backend]]:
    monkeypatch.setattr(node_check, "read_identity", lambda root, attempt, rank: SimpleNamespace(node=f"n{rank}"))

    def make(answers: dict[str, NodeAnswer | Exception], heartbeat_s: float = 0.05,
             daemons: dict[str, bool | None] | None = None, early: bool = True) -> tuple[NodeChecks, _Backend]:
        backend = _Backend(answers, daemons)
        run = SimpleNamespace(run_id="r000", paths=SimpleNamespace(root=tmp_path))
        return NodeChecks(run, backend, 3.0, heartbeat_s, _Inline(early)), backend  # type: ignore[arg-type]  # stand-ins
    return make


def test_a_dead_node_is_lost_beside_one_that_answered_once_a_fresh_poll_says_the_job_runs(checks: Any) -> None:
    found, backend = checks({"n1": DEAD})
    watch = _watch({0: T0, 1: T0 - 0.2})  # n1 stopped first; n0 beat its step, then waited on it
    assert found.lost(watch, T0 + 1.0, None) is None and backend.asked == [], "1 s of quiet: not yet"
    assert found.lost(watch, T0 + 1.6, None) is None and found.awaiting_poll, \
        "quiet for half the least silence (3 s): the checks start, a poll is asked"
    assert backend.asked == ["n1", "n0"], "the suspect (the oldest last beat) and a reference"
    assert found.lost(watch, T0 + 2.5, asked_at=T0 + 2.4) is None, "answered, but not silent 3 s yet"
    assert found.lost(watch, T0 + 3.6, None) is None and found.awaiting_poll, "lost: a poll is wanted first"
    assert found.lost(watch, T0 + 3.7, asked_at=T0 + 1.0) is None, "a poll asked before the checks says nothing"
    sign = found.lost(watch, T0 + 3.8, asked_at=T0 + 3.7)
    assert sign is not None and sign.node == "n1" and sign.evidence == NODE_CHECK_EVIDENCE
    assert sign.at == pytest.approx(T0 - 0.21), "dated to the node's last beat, on its own clock"
    assert "node n1 lost" in sign.reason and "within 3 s" in sign.reason


def test_a_node_the_scheduler_says_it_cannot_reach_is_lost_even_alone(checks: Any) -> None:
    found, _ = checks({"n0": UNREACHABLE})
    watch = _watch({0: T0})
    found.lost(watch, T0 + 3.5, None)
    sign = found.lost(watch, T0 + 3.6, asked_at=T0 + 3.6)
    assert sign is not None and sign.node == "n0" and "Communication connection failure" in sign.reason


@pytest.mark.parametrize("answers", [{"n0": DEAD}, {"n0": REFUSED}, {"n0": OSError("fork failed")}],
                         ids=["timed-out-alone", "refused", "could-not-check"])
def test_what_proves_nothing_ends_nothing(checks: Any, answers: dict[str, Any]) -> None:
    """A timeout with no node beside it that answered (the scheduler may be slow), a step the
    scheduler refused for its own reasons (the job ending, a step limit), a check that raised; the
    node's daemon not asked (no address known)."""
    found, backend = checks(answers, daemons={"n0": None})
    watch = _watch({0: T0})
    for now in (T0 + 1.6, T0 + 1.7, T0 + 2.9):
        assert found.lost(watch, now, asked_at=now) is None
    assert backend.asked == ["n0"], "checked once; again only past twice the quiet"
    found.lost(watch, T0 + 3.1, asked_at=T0 + 3.1)
    assert backend.asked == ["n0", "n0"]


def test_a_stalled_node_whose_daemon_accepts_is_alive_and_the_next_check_waits_twice_as_long(
        checks: Any) -> None:
    found, backend = checks({}, daemons={"n0": True, "n1": True})
    watch = _watch({0: T0, 1: T0 - 0.1})
    for now in (T0 + 1.6, T0 + 1.7, T0 + 2.2, T0 + 2.8):
        assert found.lost(watch, now, asked_at=now) is None
    assert backend.daemons_asked == [["n0", "n1"]] and backend.asked == ["n1", "n0"], \
        "the daemons asked once, a small job's steps beside them"
    assert found.counts.alive == 1
    found.lost(watch, T0 + 3.0, asked_at=T0 + 3.0)
    assert len(backend.daemons_asked) == 2, "again past twice the silence"


def test_a_small_jobs_steps_start_beside_the_daemons_ask_and_the_verdict_waits_for_both(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 24, goal 2 (the 2 s the ask added on a crash): the steps go out with the ask, not
    after its timeout; the crashed node is lost once the ask is in, never on its step alone."""
    monkeypatch.setattr(node_check, "read_identity", lambda root, attempt, rank: SimpleNamespace(node=f"n{rank}"))
    backend, pool = _Backend({"n1": DEAD}), _HeldAsk()
    run = SimpleNamespace(run_id="r000", paths=SimpleNamespace(root=tmp_path))
    found = NodeChecks(run, backend, 3.0, 0.05, pool)  # type: ignore[arg-type]  # stand-ins
    watch = _watch({0: T0, 1: T0 - 0.2})
    assert found.lost(watch, T0 + 1.6, None) is None
    assert backend.asked == ["n1", "n0"] and backend.daemons_asked == [], "steps out, the ask still under way"
    assert found.lost(watch, T0 + 3.6, asked_at=T0 + 3.6) is None, "its step timed out: not lost before the ask is in"
    pool.release()
    assert found.lost(watch, T0 + 3.7, asked_at=T0 + 3.7) is None, "the ask in: the verdict (a poll since is wanted)"
    sign = found.lost(watch, T0 + 3.8, asked_at=T0 + 3.8)
    assert sign is not None and sign.node == "n1" and "did not accept" in sign.reason
    assert backend.asked == ["n1", "n0"], "no second step"


def test_where_the_daemons_prove_nothing_a_stalled_node_that_answers_is_alive(checks: Any) -> None:
    found, backend = checks({}, daemons={"n0": None, "n1": False})
    watch = _watch({0: T0, 1: T0 - 0.1})
    for now in (T0 + 1.6, T0 + 1.7, T0 + 2.2, T0 + 2.8):
        assert found.lost(watch, now, asked_at=now) is None
    assert backend.asked == ["n1", "n0"], "the quiet node heard first and the one heard last, each once"
    found.lost(watch, T0 + 3.0, asked_at=T0 + 3.0)
    assert backend.asked == ["n1", "n0", "n1", "n0"], "again past twice the silence"


def test_a_node_that_beat_again_after_its_check_began_is_not_lost(checks: Any) -> None:
    found, _ = checks({"n1": DEAD})
    found.lost(_watch({0: T0, 1: T0 - 0.2}), T0 + 3.5, None)
    assert found.lost(_watch({0: T0 + 3.55, 1: T0 + 3.55}), T0 + 3.6, asked_at=T0 + 3.6) is None


def test_a_thousand_silent_nodes_cost_two_checks(checks: Any) -> None:
    found, backend = checks({"n733": DEAD})
    beats = {rank: T0 for rank in range(1000)}
    beats[733] = T0 - 0.3
    watch = _watch(beats)
    found.lost(watch, T0 + 3.5, None)
    sign = found.lost(watch, T0 + 3.6, asked_at=T0 + 3.6)
    assert len(backend.asked) == 2 and sign is not None and sign.node == "n733"


def test_no_check_within_the_pace_the_heartbeat_interval_or_a_long_phase(checks: Any) -> None:
    found, backend = checks({"n0": UNREACHABLE})
    assert found.lost(_watch({0: T0}, pace=0.1), T0 + 14.0, T0 + 14) is None, \
        "10 s a step: silent past 30 s only, checked once quiet for 15 s"
    assert found.lost(_watch({0: T0}, allowed=300.0), T0 + 60.0, T0 + 60) is None, "a checkpoint announced"
    slow_beats, _ = checks({"n0": UNREACHABLE}, heartbeat_s=5.0)
    assert slow_beats.lost(_watch({0: T0}), T0 + 7.0, T0 + 7) is None, "beats 5 s apart: silent past 15 s"
    assert backend.asked == []
    found.lost(_watch({0: T0}, pace=0.1), T0 + 16.0, T0 + 16)
    assert backend.asked == ["n0"]
    assert found.lost(_watch({0: T0}, pace=0.1), T0 + 20.0, T0 + 20) is None, "unreachable, but not silent 30 s yet"


def test_the_dead_node_is_found_when_its_last_beat_came_after_its_peers(checks: Any) -> None:
    """Beats are rate-limited: the survivor's last one may be older than the dead node's. The
    survivor is then the suspect and answers; the dead node, checked beside it, does not."""
    found, backend = checks({"n1": DEAD})
    watch = _watch({0: T0 - 0.2, 1: T0})
    found.lost(watch, T0 + 3.5, None)
    assert backend.asked == ["n0", "n1"], "a small job's every quiet node stepped, beside the daemons' ask"
    sign = found.lost(watch, T0 + 3.6, asked_at=T0 + 3.6)
    assert sign is not None and sign.node == "n1"


def test_a_node_that_answers_at_once_that_it_cannot_be_reached_is_lost_though_it_beat_last(checks: Any) -> None:
    """Helper 40: round after round (every 0.1 s, a fresh poll each), the unreachable node that beat
    half a second after its peer; its prompt answer once came while it was silent for less than the
    doubled wait, and it was never lost."""
    found, backend = checks({"n1": UNREACHABLE})
    watch = _watch({0: T0, 1: T0 + 0.5})
    sign = None
    now = T0
    while sign is None and now < T0 + 60:
        now += 0.1
        sign = found.lost(watch, now, asked_at=now)
    assert sign is not None and sign.node == "n1" and now < T0 + 4.0, (now - T0, backend.asked)


def test_a_lost_node_that_beats_again_before_the_poll_is_alive(checks: Any) -> None:
    found, _ = checks({"n1": DEAD})
    watch = _watch({0: T0, 1: T0 - 0.2, 2: T0})
    found.lost(watch, T0 + 3.5, None)
    assert found.lost(watch, T0 + 3.6, None) is None and found.awaiting_poll
    again = _watch({0: T0, 1: T0 + 3.65, 2: T0})
    assert found.lost(again, T0 + 3.7, asked_at=T0 + 3.7) is None
    assert found.lost(_watch({0: T0, 1: T0 + 3.65, 2: T0}), T0 + 3.8, asked_at=T0 + 3.8) is None


@pytest.mark.parametrize("how", ["suspended", "long phase"])
def test_a_silence_under_check_ends_when_the_job_stops_running_or_announces_a_long_phase(checks: Any, how: str) -> None:
    """Helper 40: the pending silence asked for a poll every second for as long as it lasted."""
    found, _ = checks({"n1": DEAD})
    found.lost(_watch({0: T0, 1: T0 - 0.2}), T0 + 3.5, None)
    assert found.awaiting_poll
    later = _watch({0: T0, 1: T0 - 0.2}, allowed=300.0 if how == "long phase" else None)
    if how == "suspended":
        later.state = JobState.SUSPENDED
    assert found.lost(later, T0 + 60.0, asked_at=T0 + 60.0) is None and not found.awaiting_poll


def test_only_a_line_about_the_node_itself_says_it_is_out_of_reach() -> None:
    from orchestrator.backends.base import Backend
    from orchestrator.commands import CommandResult

    def answer(stderr: str) -> NodeAnswer:
        result = CommandResult(args=("srun",), returncode=1, stdout="", stderr=stderr, duration_s=0.1)
        agent = SimpleNamespace(run_agent=lambda job_id, node, argv, timeout_s: result)
        return Backend.node_answers(agent, "77", "fd-n3", 3.0)  # type: ignore[arg-type]  # a stand-in backend

    assert answer("srun: error: Task launch for StepId=77.2 failed on node fd-n3: Communication connection failure\n"
                  "srun: error: Application launch failed: Communication connection failure\n").failed
    assert not answer("srun: error: slurm_receive_msg: 10.0.0.1:6817: Connection refused\n"
                      "srun: error: Unable to create step for job 77: Job/step already completing or completed\n").failed
    assert not answer("srun: error: Unable to create step for job 77: Zero Bytes were transmitted or received\n").failed


class _Pending:
    """The step checks of ``slow`` never return (a node that does not answer: srun waits to its
    timeout); the others, and the ask of the daemons, answer at once."""

    def __init__(self, slow: str) -> None:
        self.slow = slow

    def submit(self, fn: Callable[..., Any], backend: Any, job_id: str, node: Any) -> "Future[Any]":
        future: Future[Any] = Future()
        if node != self.slow:
            future.set_result(fn(backend, job_id, node))
        return future

    def submit_early(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> "list[Future[Any]]":
        return [self.submit(fn, *args) for args in calls]


def _pending_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str, backend: _Backend) -> NodeChecks:
    monkeypatch.setattr(node_check, "read_identity", lambda root, attempt, rank: SimpleNamespace(node=f"n{rank}"))
    run = SimpleNamespace(run_id="r000", paths=SimpleNamespace(root=tmp_path))
    return NodeChecks(run, backend, 3.0, 0.05, _Pending(slow))  # type: ignore[arg-type]  # stand-ins


def test_a_live_node_whose_step_is_slow_to_start_is_not_lost_beside_a_stalled_one_that_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Helper 47: n1 stalled (its ranks stopped), n0's ranks waited on it in the all-reduce; n1's step
    started in 0.10 s, n0's was still starting 1.4 s later (a busy slurmctld): n0 was taken for
    dead and the healthy job ended. Its daemon accepts a connection: no node is lost."""
    backend = _Backend({"n1": NodeAnswer(True, "a step on it ran in 0.10 s", took_s=0.1)}, daemons={"n0": True, "n1": True})
    found = _pending_checks(tmp_path, monkeypatch, "n0", backend)
    watch = _watch({0: T0, 1: T0 - 0.2})
    now = T0
    while now < T0 + 20:
        now += 0.1
        assert found.lost(watch, now, asked_at=now) is None, (now - T0, backend.asked)
    assert backend.daemons_asked, "the silence was checked"


def test_a_daemon_that_does_not_accept_with_a_step_still_starting_is_lost_beside_a_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _Backend({"n1": NodeAnswer(True, "a step on it ran in 0.10 s", took_s=0.1)}, daemons={"n0": False, "n1": True})
    found = _pending_checks(tmp_path, monkeypatch, "n0", backend)
    watch = _watch({0: T0, 1: T0 - 0.2})
    found.lost(watch, T0 + 1.5, None)
    assert backend.asked == ["n1"], "n0's check is under way (it never returns here), n1 is the reference"
    sign = found.lost(watch, T0 + 3.1, asked_at=T0 + 3.1)
    assert sign is not None and sign.node == "n0" and "did not accept a connection" in sign.reason


def test_the_dead_node_of_eight_is_found_within_the_silence_though_every_beat_ties(checks: Any) -> None:
    """Helper 47: every node's last beat is heard in the same round (one controller clock), so beat
    order picks no suspect; the 8-node job's dead node was found after 60 s (checked one a round at a
    doubling back-off). Its daemon does not accept: it is the suspect at once."""
    found, backend = checks({"n7": DEAD})
    watch = _watch({rank: T0 for rank in range(8)})
    sign, now = None, T0
    while sign is None and now < T0 + 60:
        now += 0.1
        sign = found.lost(watch, now, asked_at=now)
    assert sign is not None and sign.node == "n7" and now < T0 + 3.5, (now - T0, backend.asked)
    assert len(backend.daemons_asked) == 1 and sorted(backend.asked) == ["n0", "n7"], "one ask, two steps"


def test_a_check_still_running_while_its_peer_answered_times_out_after_a_few_times_the_peers_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The reference answered in 0.4 s: the suspect's check is given 4 x that (1.6 s), not the whole
    3 s timeout, then it is lost as one that timed out beside a node that answered."""
    backend = _Backend({"n0": NodeAnswer(True, "a step on it ran in 0.40 s", took_s=0.4)}, daemons={"n1": False})
    found = _pending_checks(tmp_path, monkeypatch, "n1", backend)
    watch = _watch({0: T0, 1: T0 - 0.2})
    found.lost(watch, T0 + 1.5, None)  # the checks start
    assert found.lost(watch, T0 + 3.0, asked_at=T0 + 3.0) is None, "1.5 s: within 4 x 0.4 s"
    sign = found.lost(watch, T0 + 3.2, asked_at=T0 + 3.2)
    assert sign is not None and sign.node == "n1", "1.7 s, past 4 x the reference's time: lost"
    assert "beside one that started in 0.40 s" in sign.reason


def test_a_check_still_running_with_no_peer_that_answered_proves_nothing_yet(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    found = _pending_checks(tmp_path, monkeypatch, "n1", _Backend({"n0": REFUSED}))
    watch = _watch({0: T0, 1: T0 - 0.2})
    found.lost(watch, T0 + 1.5, None)
    assert found.lost(watch, T0 + 4.4, asked_at=T0 + 4.4) is None, "no answer beside it: the whole timeout"


def test_a_nodes_daemon_is_asked_for_a_connection_and_nothing_is_sent() -> None:
    """Loopback: a port that listens accepts (True), a closed one refuses (False), a name that does
    not resolve or no address proves nothing (None); every node asked at once."""
    import socket

    from orchestrator.backends.daemon_probe import daemons_accept

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    try:
        answers = daemons_accept({"up": ("127.0.0.1", listening.getsockname()[1]),
                                  "down": ("127.0.0.1", closed.getsockname()[1]),
                                  "unnamed": ("no-such-host.invalid", 6818), "unknown": None}, timeout_s=2.0)
    finally:
        listening.close()
        closed.close()
    assert answers == {"up": True, "down": False, "unnamed": None, "unknown": None}


def test_slurms_nodes_are_asked_at_their_nodeaddr_and_the_sites_slurmd_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded ``scontrol -o show node`` (a node Slurm does not know fails the command; the others
    are still described) and ``SlurmdPort``; asked once a node."""
    from orchestrator.backends.slurm import backend as slurm
    from orchestrator.commands import CommandResult

    asked: list[list[str]] = []

    def scontrol(args: list[str], **_: Any) -> CommandResult:
        asked.append(args)
        shown = ("NodeName=fd-n1 Arch=x86_64 NodeAddr=10.0.0.11 NodeHostName=fd-n1 State=IDLE\n"
                 "NodeName=fd-n3 Arch=x86_64 NodeAddr=10.0.0.13 NodeHostName=fd-n3 State=MIXED\n")
        return CommandResult(args=tuple(args), returncode=1, stdout=shown, stderr="Node nope not found", duration_s=0.01)

    monkeypatch.setattr(slurm, "run_command", scontrol)
    site = slurm.SlurmBackend.__new__(slurm.SlurmBackend)
    site._daemons, site._config = {}, "SlurmdPort              = 7003\n"
    assert site.daemon_addresses("77", ["fd-n1", "fd-n3", "nope"]) == {
        "fd-n1": ("10.0.0.11", 7003), "fd-n3": ("10.0.0.13", 7003), "nope": None}
    assert asked == [["scontrol", "-o", "show", "node", "fd-n1,fd-n3,nope"]]
    site.daemon_addresses("77", ["fd-n1"])
    assert len(asked) == 1, "asked once a node"
    assert slurm.slurmd_port("") == 6818, "Slurm's default where the site does not say"


def test_a_silence_past_a_minute_is_checked_once_a_minute(checks: Any) -> None:
    """Helper 49: past a minute of silence a check went out every round (609 asks of every node's
    daemon in 120 s for one stalled job)."""
    found, backend = checks({})
    watch = _watch({0: T0, 1: T0, 2: T0})
    now = T0
    while now < T0 + 240:
        now += 0.1
        found.lost(watch, now, asked_at=now)
    assert 7 <= len(backend.daemons_asked) <= 12, len(backend.daemons_asked)  # 1.5 .. 48 s doubling, then a minute


def test_a_lost_node_is_counted_only_once_it_is_said(checks: Any) -> None:
    found, _ = checks({"n1": DEAD})
    found.lost(_watch({0: T0, 1: T0 - 0.2}), T0 + 3.5, None)
    assert found.lost(_watch({0: T0, 1: T0 - 0.2}), T0 + 3.6, None) is None, "lost, the poll awaited"
    assert found.lost(_watch({0: T0, 1: T0 + 3.55}), T0 + 3.7, asked_at=T0 + 3.7) is None, "it beat again"
    assert found.counts.lost == 0 and found.counts.silences == 1


def test_where_no_nodes_daemon_accepts_the_report_says_what_the_checks_cannot_prove() -> None:
    import socket

    from orchestrator.backends.base import DAEMONS_SILENT, Backend

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    site = SimpleNamespace(daemon_addresses=lambda job_id, nodes: {node: ("127.0.0.1", port) for node in nodes})
    try:
        answers = Backend.daemons_accept(site, "77", ["n0", "n1"], 2.0)  # type: ignore[arg-type]  # a stand-in backend
    finally:
        closed.close()
    assert answers == {"n0": False, "n1": False}
    assert Backend.site_notes(site) == [DAEMONS_SILENT]  # type: ignore[arg-type]  # a stand-in backend


def test_one_crashed_quiet_node_of_several_is_lost_at_the_first_check_beside_the_one_heard_last(checks: Any) -> None:
    """Helper 50: the early steps include a reference that beats on (the node heard last); without
    it the crash among live nodes was first counted as a stall and found 4 s later."""
    found, backend = checks({"n5": DEAD})
    sign, now = None, T0
    while sign is None and now < T0 + 30:
        now += 0.1
        beats = {rank: (now if rank != 5 else T0) for rank in range(6)}  # n0-n4 beat on; n5 went quiet at T0
        sign = found.lost(_watch(beats), now, asked_at=now)
    assert sign is not None and sign.node == "n5" and now < T0 + 3.5, (now - T0, backend.asked)
    assert found.counts.silences == 1 and found.counts.alive == 0
    assert backend.asked[0] == "n5" and len(backend.asked) == 2, "the quiet node and one heard last"


def test_with_no_thread_free_for_early_steps_the_steps_wait_for_the_daemons_answer(checks: Any) -> None:
    found, backend = checks({"n1": DEAD}, early=False)
    watch = _watch({0: T0, 1: T0 - 0.2})
    found.lost(watch, T0 + 1.6, None)
    assert backend.daemons_asked == [["n0", "n1"]] and backend.asked == ["n1", "n0"], \
        "after the ask: its suspect and a reference whose daemon accepted"


def test_a_daemons_ask_never_waits_behind_early_steps_nor_an_early_step_in_a_queue() -> None:
    """Helper 50: a stalled job's early steps (slow to start on a busy scheduler) held the shared
    threads, and another run's crash was found 1.8 s later than without early steps."""
    pool, slow = node_check.CheckPool(2), threading.Event()
    try:
        early = pool.submit_early(slow.wait, [(30,), (30,)])
        assert early is not None and len(early) == 2
        assert pool.submit_early(slow.wait, [(30,)]) is None, "no thread free: not queued"
        assert pool.submit(lambda: "asked").result(timeout=10) == "asked", "the ask runs beside them"
        slow.set()
        for future in early:
            future.result(timeout=10)
        deadline = time.monotonic() + 10
        while (again := pool.submit_early(lambda: None, [(), ()])) is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the done callbacks free the threads just after the results are set
        assert again is not None, "threads freed once their steps ended"
    finally:
        slow.set()
        pool.shutdown()
