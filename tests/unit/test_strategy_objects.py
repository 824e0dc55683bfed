"""The restart strategies as objects and the backends' capabilities as one typed set: every
strategy answers a failure from the facts of its job alone, every backend says what it can do once,
and the spec, the scripts and the tracker all read those two tables."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.backends.base import Backend
from orchestrator.backends.local.backend import LocalBackend
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.slurm.backend import SlurmBackend
from orchestrator.campaign.capabilities import BACKENDS, BackendCapabilities, Capability
from orchestrator.campaign.strategies import TRAITS, StrategyName, strategies_on
from orchestrator.strategies.base import Continuation, FailedJob, FailureFacts
from orchestrator.strategies.registry import STRATEGIES, strategy_for

# The Backend method each action capability stands for (the rest are said by scripts and the spec).
ACTIONS = {Capability.SIGNAL_RANKS: "signal_ranks", Capability.REQUEUE: "requeue",
           Capability.KILL_RANK_STEP: "kill_rank_step", Capability.SET_TIME_LEFT: "set_time_left",
           Capability.JOB_NODES: "job_nodes", Capability.ARRAYS: "submit_array"}
BACKEND_CLASSES: dict[str, type[Backend]] = {"local": LocalBackend, "slurm": SlurmBackend, "pbs": PBSBackend}


def _facts() -> list[FailureFacts]:
    return [FailureFacts(*values) for values in itertools.product((False, True), repeat=5)]


def test_every_strategy_has_its_traits_and_its_object() -> None:
    assert set(TRAITS) == set(STRATEGIES) == set(StrategyName)
    assert all(strategy_for(name.value).traits is TRAITS[name] for name in StrategyName)


def _new_job(facts: FailureFacts) -> tuple[Continuation, FailedJob]:
    """Resubmit's answer, written out: a new job; the failed one left if it ended, closed if only
    its launch exited (the batch script ends it), else cancelled."""
    return Continuation.NEW_JOB, (FailedJob.LEFT if facts.job_ended else FailedJob.CLOSED if facts.launch_exited
                                  else FailedJob.CANCELLED)


def test_resubmit_always_goes_on_in_a_new_job_and_closes_what_still_runs() -> None:
    for facts in _facts():
        answer = strategy_for("resubmit").on_failure(facts)
        assert (answer.continuation, answer.failed_job) == _new_job(facts), facts


def test_in_allocation_relaunches_in_a_live_job_and_ends_a_hung_launch_alone() -> None:
    for facts in _facts():
        answer = strategy_for("in-allocation").on_failure(facts)
        # The allocation is gone, queued again, or being taken back (preempted, at its walltime): a new job.
        if facts.job_ended or facts.requeued or facts.job_taken_back:
            assert (answer.continuation, answer.failed_job) == _new_job(facts), facts
        else:
            assert answer.continuation is Continuation.RELAUNCH
            assert answer.failed_job is (FailedJob.LEFT if facts.launch_exited else FailedJob.STEP_ENDED), facts


def test_requeue_never_cancels_the_job_that_is_the_next_attempt() -> None:
    for facts in _facts():
        answer = strategy_for("requeue").on_failure(facts)
        assert (answer.continuation, answer.failed_job) == (Continuation.REQUEUE, FailedJob.LEFT), facts


def test_warm_follows_only_a_re_formation_its_coordinator_reported_in_a_live_job() -> None:
    for facts in _facts():
        answer = strategy_for("warm").on_failure(facts)
        if facts.warm_reformed and not facts.job_ended and not facts.job_taken_back:
            assert (answer.continuation, answer.failed_job) == (Continuation.FOLLOW_WARM, FailedJob.LEFT)
        else:  # found from outside (a hang, the job's end), or the job is being taken back: a new job, as resubmit
            assert (answer.continuation, answer.failed_job) == _new_job(facts), facts


def test_each_backend_declares_its_row_and_implements_exactly_its_actions() -> None:
    assert set(BACKEND_CLASSES) == set(BACKENDS)
    for name, cls in BACKEND_CLASSES.items():
        assert cls.capabilities is BACKENDS[name], name
        for capability, method in ACTIONS.items():
            overridden = getattr(cls, method) is not getattr(Backend, method)
            assert overridden is (capability in cls.capabilities), f"{name}: {method} vs {capability}"


def test_a_capability_is_offered_or_explained_never_both_nor_neither() -> None:
    with pytest.raises(ValueError, match="offered or explained once"):
        BackendCapabilities("x", frozenset({Capability.REQUEUE}), {})
    with pytest.raises(ValueError, match="offered or explained once"):
        BackendCapabilities("x", frozenset(Capability), {Capability.REQUEUE: "no"})
    assert BACKENDS["pbs"].why_not(Capability.REQUEUE).startswith("the pbs backend cannot requeue")
    assert BACKENDS["slurm"].why_not(Capability.REQUEUE) is None


def test_the_strategies_each_backend_runs_follow_from_its_capabilities() -> None:
    assert strategies_on("slurm") == tuple(StrategyName)
    assert strategies_on("local") == strategies_on("pbs") == (
        StrategyName.RESUBMIT, StrategyName.IN_ALLOCATION, StrategyName.WARM, StrategyName.ELASTIC)
    assert TRAITS[StrategyName.REQUEUE].why_not_on("local") == "the local backend has no scheduler queue to put a job back in"


def test_a_strategy_says_which_workloads_it_runs_and_what_to_use_instead() -> None:
    warm = TRAITS[StrategyName.WARM]
    assert warm.why_not_for("torch", command=False) is None and warm.why_not_for("chainer", command=False) is None
    assert warm.why_not_for("torch", command=True) == (
        "restart.strategy warm re-forms the built-in workloads' process group in place; a command workload "
        "brings its own: use resubmit or in-allocation")
    assert "runs the torch, tensorflow, chainer workload(s), not other" in warm.why_not_for("other", command=False)
    assert all(TRAITS[name].why_not_for("other", command=True) is None for name in StrategyName if name != "warm")
