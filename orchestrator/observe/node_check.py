"""A node whose ranks all fell silent: is it dead, or only slow? (issue 24, goal 2)

After a node crash the scheduler says nothing for SlurmdTimeout and more (28-30 s here: the rank
step ends only once Slurm declares the node down), and the survivors learn of it from their
collective's timeout. The drill's first sign is the node's own silence: none of its ranks has
beaten for ``restart.node_silence_s`` (and for at least NODE_SILENCE_BEATS of the attempt's step
times and heartbeat intervals). Silence alone proves nothing (a checkpoint, a slow step, a stalled
node, every rank of a data-parallel job waiting on one), so once the nodes have been quiet for
CHECK_AT of the least silence (the verdict still waits for all of it) it is checked, in two steps:

1. **Every node's scheduler daemon is asked for a connection** (``Backend.daemons_accept``: one
   thread, every node at once, DAEMON_TIMEOUT_S). A node that is up accepts however loaded it is;
   a crashed one does not. Where no node accepted (the backend knows no address, the site's port
   is closed to this host), the answers prove nothing and step 2 alone decides, on the scheduler's
   own word only.
2. **A step is started on the suspects** (``Backend.node_answers``: can the scheduler still start
   one on the node, inside the job's allocation, within CHECK_TIMEOUT_S?): the quiet nodes whose
   daemon did not accept (every quiet node's beats tie on one controller round, so no beat order
   picks one), and a reference, a node whose daemon accepted (the one heard last). Where the
   daemons proved nothing: the quiet node heard first and the one heard last. A silence of at most
   EARLY_STEPS_MAX quiet nodes (a small job's) has its steps started beside the ask, on every quiet
   node and the node heard last, where CheckPool has a thread free for each (on threads of their
   own: no ask waits behind them), so that a crashed node's verdict is in as the ask's answer is;
   quiet nodes whose daemons all accept are still alive whatever their steps say.

A node is lost when the scheduler says it cannot reach it (``failed``), or when no step started on
it within the timeout, or within PATIENCE_X times the reference's time (at least PATIENCE_S) once
the reference answered, **and its daemon did not accept a connection while another node's did**.
A step that is only slow to start (a busy slurmctld, a loaded node) never loses a live node: its
daemon accepts. Quiet nodes whose daemons all accept are alive at once (no further step). A
check the scheduler refused for a reason of its own (the job ending, a step limit, an option it
lacks) proves nothing.

A lost node fails the attempt (``FailureSign`` evidence ``node_check``, dated to its last beat)
once a scheduler poll asked after the silence began still says the job runs (a job that ended
meanwhile is the scheduler's to explain). A node that answers is alive: the next silence is checked
only when twice as long. Strategies with a coordinator of their own (warm, elastic) are left to it.

The checks run on threads of their own: the control loop never waits for one."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from injectors.targets import TargetRefused, read_identity
from orchestrator.observe.watch import AttemptWatch, FailureSign, RankBeat
from orchestrator.states import JobState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from orchestrator.backends.base import Backend, NodeAnswer
    from orchestrator.campaign.runs import RunConfig

log = logging.getLogger(__name__)

NODE_SILENCE_BEATS = 3  # a node is silent only past this many of its step times and heartbeat intervals too
MAX_CHECK_AFTER_S = 60.0  # a silence that goes on is checked again at least this often
CHECK_TIMEOUT_S = 3.0  # a live node's scheduler daemon starts a step in well under a second
# The checks start once a node has been quiet for this share of the least silence (a live node
# beats at least every third of it), so that their answers are in when the silence is complete.
CHECK_AT = 0.5
# A check still running while its peer's answered is given this many times the peer's time (at
# least PATIENCE_S), not the whole CHECK_TIMEOUT_S: the scheduler started a step beside it at once.
PATIENCE_X = 4.0
PATIENCE_S = 1.0
NODE_CHECK_EVIDENCE = "node_check"
DAEMON_TIMEOUT_S = 2.0  # an up node's kernel accepts at once; past Linux's first SYN retransmit (1 s)
MAX_SUSPECTS = 8  # quiet nodes whose daemon did not accept, each checked with a step (at once)
# A silence of at most this many quiet nodes has its steps started beside the daemons' ask, on every
# quiet node and the node heard last, where CheckPool has threads free for them: the verdict waits
# for both, so a crash's is in as the ask's answer is, not a step's start after it (measured on
# stand-ins: 4.3 -> 3.4 s). A larger one, or one with no thread free, steps the suspects only.
EARLY_STEPS_MAX = 4


class CheckPool:
    """The node checks' threads, every run's: the daemons' asks and the steps after them on one
    executor; a small job's early steps on another, started only where it has a thread free for each,
    so that no ask waits behind an early step (a stalled job's, whose answers the ask makes moot)
    and no early step waits in a queue."""

    def __init__(self, workers: int) -> None:
        self._checks = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="node-check")
        self._early = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="node-check-early")
        self._free = workers
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        return self._checks.submit(fn, *args)

    def submit_early(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> "list[Future[Any]] | None":
        """``fn(*args)`` for each of ``calls`` at once, or None (nothing started) where the early
        threads are not all free for them."""
        with self._lock:
            if len(calls) > self._free:
                return None
            self._free -= len(calls)
        futures = [self._early.submit(fn, *args) for args in calls]
        for future in futures:
            future.add_done_callback(self._release)
        return futures

    def _release(self, _: "Future[Any]") -> None:
        with self._lock:
            self._free += 1

    def shutdown(self) -> None:
        """Queued checks dropped; one under way ends within its timeout (the threads are not waited for)."""
        self._checks.shutdown(wait=False, cancel_futures=True)
        self._early.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Silence:
    """One silence of an attempt's nodes and its checks."""

    since: float  # the earliest last beat of the silent nodes (this controller's clock)
    sent_at: float  # when it was checked: a node heard after it is alive, a poll asked after it is fresh
    quiet: dict[str, float]  # the quiet nodes then, each with its last beat heard
    daemons: "Future[dict[str, bool | None]]"  # every node's daemon asked for a connection
    accepted: dict[str, bool | None] | None = None  # their answers, once in
    checks: dict[str, "Future[NodeAnswer]"] = field(default_factory=dict)  # node -> its step's check
    steps_sent_at: float | None = None
    lost: FailureSign | None = None  # a checked node, lost: said once a fresh poll still says RUNNING

    @property
    def daemons_prove(self) -> bool:
        """Some node's daemon accepted: a daemon that did not is out of reach (the port is not
        closed to this host, nor the address unknown, for every node)."""
        return self.accepted is not None and any(answer is True for answer in self.accepted.values())

    def daemon_silent(self, node: str) -> bool:
        return self.daemons_prove and self.accepted is not None and self.accepted.get(node) is False


@dataclass
class CheckCounts:
    """What a run's node checks found (the report's ``controller_cost``): silences checked, those
    found alive (a stall: its nodes' daemons accepted or their steps started), nodes found lost."""

    silences: int = 0
    alive: int = 0
    lost: int = 0


class NodeChecks:
    """A run's node checks, attempt by attempt."""

    def __init__(self, run: "RunConfig", backend: "Backend", silence_s: float, heartbeat_s: float,
                 pool: CheckPool) -> None:
        self.run = run
        self.backend = backend
        self.silence_s = silence_s
        self.heartbeat_s = heartbeat_s
        self.pool = pool
        self._attempt: int | None = None
        self._nodes: dict[int, str] = {}  # rank -> node, from the ranks' identity files
        self._silence: _Silence | None = None
        self._answered: set[str] = set()  # nodes alive in this silence
        self._check_after_s = 0.0  # the silence (s) past which the nodes are checked (doubled after an answer)
        self._checked_at: float | None = None  # when this silence's nodes were last checked
        self.counts = CheckCounts()

    @property
    def awaiting_poll(self) -> bool:
        """A silence is being checked: the scheduler's word that the job still runs, which a lost
        node waits for, is asked now (answered by the time the checks are)."""
        return self._silence is not None

    def lost(self, watch: AttemptWatch, now: float, asked_at: float | None) -> FailureSign | None:
        """The sign of a node of ``watch``'s attempt that fell silent and did not answer its check,
        once a poll asked since (``asked_at``: this round's) says the job still runs; None while
        every node beats or answered (checks are started here when due)."""
        if self._attempt != watch.attempt:
            self._attempt, self._nodes, self._silence, self._answered = watch.attempt, {}, None, set()
            self._check_after_s, self._checked_at = 0.0, None
        nodes = self._last_beats(watch) if self.silence_s > 0 and watch.state is JobState.RUNNING else {}
        if not nodes:  # not running (suspended, ending), no beat yet, a long phase announced: no check
            self._silence = None  # a silence checked meanwhile is over (its checks, still under way, unread)
            return None
        least = self._least_silence(watch)
        quiet = {node: last for node, last in nodes.items() if now - last >= CHECK_AT * least}
        if not quiet:  # every node beats: no silence (or it ended)
            self._silence, self._answered, self._check_after_s = None, set(), CHECK_AT * least
            self._checked_at = None
            return None
        silence = self._silence
        if silence is None:
            self._check_after_s = max(self._check_after_s, CHECK_AT * least)
            if now - min(quiet.values()) < self._check_after_s:
                return None
            if (self._check_after_s >= MAX_CHECK_AFTER_S and self._checked_at is not None
                    and now - self._checked_at < MAX_CHECK_AFTER_S):
                return None  # a silence past a minute: checked once a minute, not every round
            self._checked_at = now
            self.counts.silences += 1
            silence = self._silence = _Silence(
                since=min(quiet.values()), sent_at=now, quiet=dict(quiet),
                daemons=self.pool.submit(_daemons, self.backend, watch.job_id, sorted(nodes)))
            if len(quiet) <= EARLY_STEPS_MAX:
                self._send_early_steps(watch, silence, [*sorted(quiet, key=quiet.__getitem__),
                                                        *_heard_last(nodes, exclude=quiet)], now)
        if silence.accepted is None:
            if not silence.daemons.done():
                return None
            silence.accepted = silence.daemons.result()
            if silence.daemons_prove and all(silence.accepted.get(node) is True for node in silence.quiet):
                self._alive(silence, now, least, "; ".join(f"{node}: its daemon accepts" for node in silence.quiet))
            elif not silence.checks:
                self._send_steps(watch, silence, self._targets(silence, nodes), now)
            return None
        if silence.lost is None:
            silence.lost = self._verdict(watch, silence, nodes, now, least)
        lost = silence.lost
        if lost is not None and not _silent_since(nodes, lost.node, silence.sent_at):
            self._silence = None  # it beat again while the poll was awaited: alive
            return None
        if lost is not None and asked_at is not None and asked_at >= silence.sent_at:
            self.counts.lost += 1
            return lost
        return None

    def _targets(self, silence: _Silence, nodes: dict[str, float]) -> list[str]:
        """The silence's steps once the daemons answered (see the module doc): the quiet nodes whose
        daemon did not accept and a reference whose daemon did; where the daemons proved nothing, the
        quiet node heard first (not yet answered in this silence) and the node heard last."""
        accepted = silence.accepted or {}
        if silence.daemons_prove:
            suspects = sorted((node for node in silence.quiet if accepted.get(node) is not True),
                              key=lambda node: silence.quiet[node])[:MAX_SUSPECTS]
            witnesses = [node for node in nodes if accepted.get(node) is True]
            return [*suspects, max(witnesses, key=lambda node: nodes[node])]
        unanswered = {node: last for node, last in silence.quiet.items() if node not in self._answered} \
            or silence.quiet
        suspect = min(unanswered, key=lambda node: unanswered[node])
        return [suspect, *_heard_last(nodes, exclude={suspect})]

    def _send_steps(self, watch: AttemptWatch, silence: _Silence, targets: list[str], now: float) -> None:
        silence.steps_sent_at = now
        for node in targets:
            silence.checks[node] = self.pool.submit(_ask, self.backend, watch.job_id, node)

    def _send_early_steps(self, watch: AttemptWatch, silence: _Silence, targets: list[str], now: float) -> None:
        """``targets``' steps beside the daemons' ask, where the pool has a thread free for each
        (else the steps wait for the ask's answer, as a larger job's do)."""
        futures = self.pool.submit_early(_ask, [(self.backend, watch.job_id, node) for node in targets])
        if futures is not None:
            silence.steps_sent_at = now
            silence.checks = dict(zip(targets, futures, strict=True))

    def _verdict(self, watch: AttemptWatch, silence: _Silence, nodes: dict[str, float],
                 now: float, least: float) -> FailureSign | None:
        """Once the silence's checks are answered: a checked node lost (once silent as long as the
        least silence: one that beat later than its peer waits for it), or the next silence set."""
        answers = _answers(silence, now)
        if answers is None:
            return None
        self._answered |= {node for node, answer in answers.items() if answer.answered}
        some_alive = any(answer.answered for answer in answers.values())
        for node, answer in answers.items():  # either may be the dead one: beats are rate-limited
            lost = answer.failed or (answer.timed_out and some_alive and silence.daemon_silent(node))
            if not lost or not _silent_since(nodes, node, silence.sent_at):
                continue
            if now - nodes[node] < least:
                return None  # it beat later than its peer: lost once it has been silent as long
            beats = self._beats_of(watch, node)
            at = max(beat.time for beat in beats) if beats else silence.since
            daemon = "; its scheduler daemon did not accept a connection" if silence.daemon_silent(node) else ""
            return FailureSign(f"node {node} lost: its ranks silent {now - nodes[node]:.1f} s and {answer.said}{daemon}",
                               at, NODE_CHECK_EVIDENCE, node=node)
        self._alive(silence, now, least, "; ".join(f"{node}: {answer.said}" for node, answer in answers.items()))
        return None

    def _alive(self, silence: _Silence, now: float, least: float, said: str) -> None:
        """Nothing lost in this silence (alive, or nothing proved): the next check after twice the
        silence (at most a minute)."""
        log.info("%s: nodes silent %.1f s; checked: %s", self.run.run_id, now - silence.since, said)
        self.counts.alive += 1
        if silence.daemons_prove:
            self._answered |= {node for node in silence.quiet if (silence.accepted or {}).get(node) is True}
        self._silence = None
        self._check_after_s = min(2 * self._check_after_s, max(MAX_CHECK_AFTER_S, least))

    def _least_silence(self, watch: AttemptWatch) -> float:
        pace = watch.steps_per_s()
        step_s = 1 / pace if pace else 0.0
        return max(self.silence_s, NODE_SILENCE_BEATS * step_s, NODE_SILENCE_BEATS * self.heartbeat_s)

    def _last_beats(self, watch: AttemptWatch) -> dict[str, float]:
        """Each node's last beat (this controller's clock) over its ranks heard so far; none while
        any rank announced a long phase (a checkpoint, a resume: the hang timeout's to judge)."""
        if any(beat.allowed_s for beat in watch.beats.values()):
            return {}
        last: dict[str, float] = {}
        for rank, beat in watch.beats.items():
            node = self._node(watch, rank)
            if node is not None:
                heard = beat.time if beat.seen is None else beat.seen
                last[node] = max(last.get(node, heard), heard)
        return last

    def _beats_of(self, watch: AttemptWatch, node: str) -> list[RankBeat]:
        return [beat for rank, beat in watch.beats.items() if self._nodes.get(rank) == node]

    def _node(self, watch: AttemptWatch, rank: int) -> str | None:
        node = self._nodes.get(rank)
        if node is None:
            try:
                node = self._nodes[rank] = read_identity(self.run.paths.root, watch.attempt, rank).node
            except TargetRefused:
                return None
        return node


def _answers(silence: _Silence, now: float) -> "dict[str, NodeAnswer] | None":
    """The silence's answers once all are in, or once a node answered and the other's check has
    run past the patience its answer sets (then timed out); None meanwhile."""
    from orchestrator.backends.base import NodeAnswer

    done = {node: check.result() for node, check in silence.checks.items() if check.done()}
    if len(done) == len(silence.checks):
        return done
    took = [answer.took_s for answer in done.values() if answer.answered and answer.took_s is not None]
    waited = now - (silence.steps_sent_at if silence.steps_sent_at is not None else silence.sent_at)
    if not took or waited < max(PATIENCE_S, PATIENCE_X * max(took)):
        return None
    late = NodeAnswer(False, f"no step started on it within {waited:.1f} s, beside one that started in "
                             f"{max(took):.2f} s", timed_out=True)
    return {node: done.get(node, late) for node in silence.checks}


def _heard_last(nodes: dict[str, float], exclude: "Iterable[str]") -> list[str]:
    """The node heard last apart from ``exclude``, as a list (empty where there is none)."""
    left_out = set(exclude)
    others = {node: last for node, last in nodes.items() if node not in left_out}
    return [max(others, key=lambda node: others[node])] if others else []


def _silent_since(nodes: dict[str, float], node: str | None, moment: float) -> bool:
    """``node`` has not been heard after ``moment`` (this controller's clock)."""
    return node is not None and node in nodes and nodes[node] <= moment


def _ask(backend: "Backend", job_id: str, node: str) -> "NodeAnswer":
    """The backend's check of ``node``, whatever goes wrong in it an answer that proves nothing."""
    from orchestrator.backends.base import NodeAnswer

    try:
        return backend.node_answers(job_id, node, CHECK_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - a check that could not be made proves nothing
        return NodeAnswer(False, f"the check could not be made ({type(error).__name__}: {error})")


def _daemons(backend: "Backend", job_id: str, nodes: list[str]) -> dict[str, bool | None]:
    """The backend's ask of the nodes' daemons; whatever goes wrong in it, answers that prove nothing."""
    try:
        return backend.daemons_accept(job_id, nodes, DAEMON_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - an ask that could not be made proves nothing
        log.warning("the nodes' daemons could not be asked (%s: %s)", type(error).__name__, error)
        return dict.fromkeys(nodes)
