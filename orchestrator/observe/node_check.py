"""A node whose ranks all fell silent: is it dead, or only slow? (issue 24, goal 2)

After a node crash the scheduler says nothing for SlurmdTimeout and more (28-30 s here: the rank
step ends only once Slurm declares the node down), and the survivors learn of it from their
collective's timeout. The drill's first sign is the node's own silence: none of its ranks has
beaten for ``restart.node_silence_s`` (and for at least NODE_SILENCE_BEATS of the attempt's step
times and heartbeat intervals). Silence alone proves nothing (a checkpoint, a slow step, a stalled
node, every rank of a data-parallel job waiting on one), so it is confirmed by checks, the
backend's ``node_answers`` (can the scheduler still start a step on the node, inside the job's
allocation, within CHECK_TIMEOUT_S?), two a silence whatever the job's size, sent once the nodes
have been quiet for CHECK_AT of the least silence (the verdict still waits for all of it):

- the suspect: the silent node whose ranks beat last the longest ago (a dead node stops at once;
  its peers beat their step a moment later, then wait for it in a collective) and that has not
  answered in this silence yet;
- a reference: the node that beat most recently, checked beside it (beats are rate-limited: either
  may be the dead one). A node whose check times out is lost only where the other answered in the
  same silence (the scheduler starts steps, only not on that node); once the other answered, the
  check still running is given PATIENCE_X times its time (at least PATIENCE_S), not the whole
  timeout. A check the scheduler refused for a reason of its own (the job ending, a step limit, an
  option it lacks) proves nothing.

A lost node fails the attempt (``FailureSign`` evidence ``node_check``, dated to its last beat)
once a scheduler poll asked after the silence began still says the job runs (a job that ended
meanwhile is the scheduler's to explain). A node that answers is alive: the next silence is checked
only when twice as long. Strategies with a coordinator of their own (warm, elastic) are left to it.

The checks run on threads of their own: the control loop never waits for one."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from injectors.targets import TargetRefused, read_identity
from orchestrator.observe.watch import AttemptWatch, FailureSign, RankBeat
from orchestrator.states import JobState

if TYPE_CHECKING:
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


@dataclass
class _Silence:
    """One silence of an attempt's nodes and its checks."""

    since: float  # the earliest last beat of the silent nodes (this controller's clock)
    sent_at: float  # when the checks were sent: a node heard after it is alive, a poll asked after it is fresh
    checks: dict[str, "Future[NodeAnswer]"] = field(default_factory=dict)  # node -> its check
    lost: FailureSign | None = None  # a checked node, lost: said once a fresh poll still says RUNNING


class NodeChecks:
    """A run's node checks, attempt by attempt."""

    def __init__(self, run: "RunConfig", backend: "Backend", silence_s: float, heartbeat_s: float,
                 pool: ThreadPoolExecutor) -> None:
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
            self._check_after_s = 0.0
        nodes = self._last_beats(watch) if self.silence_s > 0 and watch.state is JobState.RUNNING else {}
        if not nodes:  # not running (suspended, ending), no beat yet, a long phase announced: no check
            self._silence = None  # a silence checked meanwhile is over (its checks, still under way, unread)
            return None
        least = self._least_silence(watch)
        quiet = {node: last for node, last in nodes.items() if now - last >= CHECK_AT * least}
        if not quiet:  # every node beats: no silence (or it ended)
            self._silence, self._answered, self._check_after_s = None, set(), CHECK_AT * least
            return None
        silence = self._silence
        if silence is None:
            self._check_after_s = max(self._check_after_s, CHECK_AT * least)
            if now - min(quiet.values()) < self._check_after_s:
                return None
            self._silence = self._begin(watch, quiet, nodes, now)
            return None
        if silence.lost is None:
            silence.lost = self._verdict(watch, silence, nodes, now, least)
        lost = silence.lost
        if lost is not None and not _silent_since(nodes, lost.node, silence.sent_at):
            self._silence = None  # it beat again while the poll was awaited: alive
            return None
        if lost is not None and asked_at is not None and asked_at >= silence.sent_at:
            return lost
        return None

    def _begin(self, watch: AttemptWatch, silent: dict[str, float], nodes: dict[str, float], now: float) -> _Silence:
        """The silence's checks: the suspect (the oldest last beat among the silent nodes that have
        not answered in it) and a reference (the node that beat last)."""
        unanswered = {node: last for node, last in silent.items() if node not in self._answered} or silent
        suspect = min(unanswered, key=lambda node: unanswered[node])
        others = {node: last for node, last in nodes.items() if node != suspect}
        reference = max(others, key=lambda node: others[node]) if others else None
        silence = _Silence(since=min(silent.values()), sent_at=now)
        for node in filter(None, (suspect, reference)):
            silence.checks[node] = self.pool.submit(_ask, self.backend, watch.job_id, node)
        return silence

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
            lost = answer.failed or (answer.timed_out and some_alive)
            if not lost or not _silent_since(nodes, node, silence.sent_at):
                continue
            if now - nodes[node] < least:
                return None  # it beat later than its peer: lost once it has been silent as long
            beats = self._beats_of(watch, node)
            at = max(beat.time for beat in beats) if beats else silence.since
            return FailureSign(f"node {node} lost: its ranks silent {now - nodes[node]:.1f} s and {answer.said}",
                               at, NODE_CHECK_EVIDENCE, node=node)
        log.info("%s: nodes silent %.1f s; checked: %s", self.run.run_id, now - silence.since,
                 "; ".join(f"{node}: {answer.said}" for node, answer in answers.items()))
        self._silence = None
        # alive, or nothing proved: the next check after twice the silence (at most a minute)
        self._check_after_s = min(2 * self._check_after_s, max(MAX_CHECK_AFTER_S, least))
        return None

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
    waited = now - silence.sent_at
    if not took or waited < max(PATIENCE_S, PATIENCE_X * max(took)):
        return None
    late = NodeAnswer(False, f"no step started on it within {waited:.1f} s, beside one that started in "
                             f"{max(took):.2f} s", timed_out=True)
    return {node: done.get(node, late) for node in silence.checks}


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
