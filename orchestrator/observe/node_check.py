"""A node whose ranks all fell silent: is it dead, or only slow? (issue 24, goal 2)

After a node crash the scheduler says nothing for SlurmdTimeout and more (28-30 s here: the rank
step ends only once Slurm declares the node down), and the survivors learn of it from their
collective's timeout. The drill's first sign is the node's own silence: none of its ranks has
beaten for ``restart.node_silence_s`` (at least NODE_SILENCE_STEPS of the attempt's step times, as
this controller heard them). Silence alone proves nothing (a checkpoint, a slow step, a stalled
node, every rank of a data-parallel job waiting on one), so it is confirmed by one check, the
backend's ``node_answers``: can the scheduler still start a step on the node, inside the job's
allocation (``srun --overlap``), within CHECK_TIMEOUT_S? A node that does not answer is lost: the
attempt failed there (``FailureSign`` evidence ``node_check``, dated to the node's last beat) and
its strategy ends or relaunches it off that node. A node that answers is alive: the drill waits on
(its hang timeout still stands) and checks it again only after twice as long a silence.

The checks run on a thread of their own: the control loop never waits for one."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from injectors.targets import TargetRefused, read_identity
from orchestrator.observe.watch import AttemptWatch, FailureSign, RankBeat
from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend, NodeAnswer
    from orchestrator.campaign.runs import RunConfig

log = logging.getLogger(__name__)

NODE_SILENCE_STEPS = 3  # a node is silent only past this many of the attempt's step times too
CHECK_TIMEOUT_S = 3.0  # a live node's scheduler daemon starts a step in well under a second
NODE_CHECK_EVIDENCE = "node_check"


@dataclass
class _NodeWatch:
    """One node's checks in one attempt: the one under way, and the silence the next one waits for."""

    check_after_s: float  # the silence (s) past which the node is checked (doubled after each answer)
    checking: "Future[NodeAnswer] | None" = None
    silent_since: float = 0.0  # the node's last beat (this controller's clock) when the check began


class NodeChecks:
    """A run's node checks, attempt by attempt."""

    def __init__(self, run: "RunConfig", backend: "Backend", silence_s: float, pool: ThreadPoolExecutor) -> None:
        self.run = run
        self.backend = backend
        self.silence_s = silence_s
        self.pool = pool
        self._attempt: int | None = None
        self._nodes: dict[int, str] = {}  # rank -> node, from the ranks' identity files
        self._watches: dict[str, _NodeWatch] = {}

    def lost(self, watch: AttemptWatch, now: float) -> FailureSign | None:
        """The sign of a node of ``watch``'s attempt that fell silent and did not answer its check;
        None while every node beats or answered (a check is started here when one is due)."""
        if self.silence_s <= 0 or watch.state is not JobState.RUNNING or not watch.beats:
            return None
        if self._attempt != watch.attempt:
            self._attempt, self._nodes, self._watches = watch.attempt, {}, {}
        for node, beats in self._ranks_by_node(watch).items():
            sign = self._look(watch, node, beats, now)
            if sign is not None:
                return sign
        return None

    def _look(self, watch: AttemptWatch, node: str, beats: list[RankBeat], now: float) -> FailureSign | None:
        last = max(beat.time if beat.seen is None else beat.seen for beat in beats)
        least = self.silence_s
        pace = watch.steps_per_s()
        if pace:
            least = max(least, NODE_SILENCE_STEPS / pace)
        if any(beat.allowed_s for beat in beats):
            return None  # a long phase the ranks announced (a checkpoint, a resume): the hang timeout's
        state = self._watches.setdefault(node, _NodeWatch(check_after_s=least))
        if state.checking is not None and state.checking.done():
            answer = state.checking.result()
            state.checking = None
            if not answer.answered and last <= state.silent_since:
                newest = max(beats, key=lambda beat: beat.time)
                return FailureSign(f"node {node} lost: its ranks silent {now - last:.1f} s and {answer.said}",
                                   newest.time, NODE_CHECK_EVIDENCE, node=node)
            if answer.answered:
                log.info("%s: node %s silent %.1f s, and it answered: alive", self.run.run_id, node, now - last)
                state.check_after_s *= 2
        if state.checking is None and now - last >= state.check_after_s:
            state.silent_since = last
            state.checking = self.pool.submit(self.backend.node_answers, watch.job_id, node, CHECK_TIMEOUT_S)
        if now - last < least:
            state.check_after_s = least  # it beat again: the next silence is checked at the least
        return None

    def _ranks_by_node(self, watch: AttemptWatch) -> dict[str, list[RankBeat]]:
        """The beats of each node's ranks (ranks not registered yet, or not heard yet: none)."""
        nodes: dict[str, list[RankBeat]] = {}
        for rank, beat in watch.beats.items():
            node = self._nodes.get(rank)
            if node is None:
                try:
                    node = self._nodes[rank] = read_identity(self.run.paths.root, watch.attempt, rank).node
                except TargetRefused:
                    continue
            nodes.setdefault(node, []).append(beat)
        return nodes
