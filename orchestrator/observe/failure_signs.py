"""From what the controller sees of an attempt to the facts of its failure: whether it failed (and
the best evidence of when), the facts the class table (orchestrator.campaign.failure_classes) reads, and the
nodes to blame. The facts are kept in the ledger with the attempt (``class_facts``), so that the
class can be taken again with the scheduler's final word — by this controller or the next one."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from injectors.targets import TargetRefused, read_identity
from orchestrator.campaign.failure_classes import DrillEnded, FailureClass, FailureEvidence
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import RestartConfig
from orchestrator.observe.watch import AttemptWatch, FailureSign, rank_error_suffix, rank_errors
from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

# A launch that exits this close to its walltime or after ended at it: the scheduler's kill comes at
# the limit (Slurm checks limits every ~30 s: later, never earlier) and the batch script's clock
# reads its start a moment after the job's.
WALLTIME_SLACK_S = 5.0


def failure_sign(watch: AttemptWatch, state: JobState, now: float, restart: RestartConfig, backend: "Backend",
                 asked_at: float | None = None, node_lost: FailureSign | None = None) -> FailureSign | None:
    """Why the attempt failed, with the best evidence of when; None while it looks healthy.
    ``asked_at``: when the scheduler's answer of this round was asked (None: no answer).
    ``node_lost``: a node of the attempt fell silent and did not answer its check (node_check.py)."""
    if watch.warm_failure is not None:
        lost = watch.warm_failure
        how = f", exit code {lost.exit_code}" if lost.exit_code >= 0 else ""
        what = lost.what or f"rank {lost.rank} lost{how}"
        return FailureSign(f"{what}{rank_error_suffix(watch)}", lost.time, "warm")
    if watch.step_exit is not None and watch.step_exit.exit_code != 0:
        return FailureSign(f"rank launch exited with code {watch.step_exit.exit_code}"
                           f"{rank_error_suffix(watch)}", watch.step_exit.time, "step_exit")
    if state.is_terminal and not state.is_success:
        ended = backend.end_time(watch.job_id)
        return FailureSign(f"job {state.value.lower()}{rank_error_suffix(watch)}", ended or now,
                           "scheduler_end" if ended else "poll")
    if state is JobState.UNKNOWN:
        return FailureSign(backend.vanished_why(), now, "poll")
    if requeued(watch, state):
        return FailureSign(f"the scheduler requeued the job{rank_error_suffix(watch)}", now, "requeued")
    if watch.completed:
        return None  # no more heartbeats to come; the scheduler reports how the job ends
    if node_lost is not None:
        return node_lost
    hang = watch.hang(now, restart.hang_timeout_s)
    if hang is None:
        watch.silent_since = None
        return watch.stuck_start(now, restart.start_timeout_s)
    # Silence is a hang only if the scheduler, asked since, does not say the job is suspended
    # (its state comes at the slow pace: ask it now, and decide on its answer).
    if watch.silent_since is None:
        watch.silent_since = now
    return hang if asked_at is None or asked_at >= watch.silent_since else None


def _warm_exit_code(watch: AttemptWatch) -> int | None:
    assert watch.warm_failure is not None
    code = watch.warm_failure.exit_code
    return code if code >= 0 else None


def requeued(watch: AttemptWatch, state: JobState) -> bool:
    """The scheduler put the running job back in the queue (a preemption that requeues)."""
    return state is JobState.REQUEUED or (state is JobState.PENDING and watch.running_since is not None)


def failure_evidence(watch: AttemptWatch, sign: FailureSign, state: JobState, backend: "Backend",
                     lost_nodes: tuple[str, ...] = (), oom_killed: tuple[str, ...] = (),
                     ended_by_drill: DrillEnded | None = None, signalled: str | None = None,
                     time_limit_s: float | None = None) -> FailureEvidence:
    """What is known of the failure. ``time_limit_s``: the job's walltime as its spec gave it (a
    fault that moved it is the scheduler's to report)."""
    exit_code = (watch.step_exit.exit_code if watch.step_exit is not None
                 else _warm_exit_code(watch) if watch.warm_failure is not None
                 else backend.exit_code(watch.job_id) if state.is_terminal else None)
    return FailureEvidence(state=state, noticed_by=sign.evidence, exit_code=exit_code,
                           rank_errors=tuple(error for _, _, error in rank_errors(watch)), warned=watch.warned,
                           lost_nodes=lost_nodes, oom_killed=oom_killed, ended_by_drill=ended_by_drill,
                           signalled=signalled, walltime_reached=walltime_reached(watch, sign, time_limit_s))


def walltime_reached(watch: AttemptWatch, sign: FailureSign, time_limit_s: float | None) -> bool:
    """The failure came when the job's time was up: its start (the batch script's first line) plus
    its time limit, both on the job's clock as the launch's exit is (a step exit, here only: other
    evidence comes from the login node's clock, and the scheduler says TIMEOUT itself)."""
    if time_limit_s is None or watch.job_started is None or sign.evidence != "step_exit":
        return False
    return sign.at >= watch.job_started + time_limit_s - WALLTIME_SLACK_S


def blamed_nodes(run: RunConfig, watch: AttemptWatch, sign: FailureSign, evidence: FailureEvidence,
                 failure_class: FailureClass, stopped_nodes: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The nodes to blame: those a node fault broke; for a hang, the node of the rank the injector
    stopped, else the silent rank's (the most overdue heartbeat: in a data-parallel job its peers,
    waiting on it in a collective, fall silent with it, so that guess can name a waiting peer)."""
    if evidence.lost_nodes:
        return evidence.lost_nodes
    if failure_class is FailureClass.HANG and stopped_nodes:
        return tuple(dict.fromkeys(stopped_nodes))
    if failure_class is FailureClass.HANG and sign.rank is not None:
        try:
            return (read_identity(run.paths.root, watch.attempt, sign.rank).node,)
        except TargetRefused:
            return ()
    return ()


def facts_json(evidence: FailureEvidence) -> str:
    """The facts as the ledger keeps them (``attempts.class_facts``)."""
    return json.dumps({**asdict(evidence), "state": evidence.state.value})


def facts_from_json(text: str) -> FailureEvidence:
    data = json.loads(text)
    return FailureEvidence(**{**data, "state": JobState(data["state"]), "rank_errors": tuple(data["rank_errors"]),
                              "lost_nodes": tuple(data["lost_nodes"]), "oom_killed": tuple(data.get("oom_killed", ())),
                              "oom_steps": tuple(data.get("oom_steps", ())),
                              "ended_by_drill": DrillEnded(**data["ended_by_drill"]) if data.get("ended_by_drill") else None})
