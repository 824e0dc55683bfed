"""The restart policy (issue 9): per failure class an action, a budget, whether it spends the run's
failure budget, a backoff; the defaults a user expects. Pure decisions here; the drills below run
them for real on the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from drills import drill, run_of, write_spec
from orchestrator.campaign.failure_classes import FailureClass as C
from orchestrator.campaign.policy import PolicyEntry, decide, policy_entry, restarts_left


def test_a_persons_cancel_gives_up_by_default() -> None:
    decision = decide({}, [C.CANCELLED], max_restarts=3)
    assert not decision.restart and decision.reason == "CANCELLED: the policy gives up"


def test_walltimes_and_preemptions_do_not_spend_the_failure_budget() -> None:
    history = [C.TIMEOUT, C.PREEMPTED, C.TIMEOUT, C.RANK_SIGNAL]
    assert decide({}, history, max_restarts=1).restart  # one RANK_SIGNAL: within a budget of 1
    assert not decide({}, [*history, C.HANG], max_restarts=1).restart
    assert decide({}, [C.TIMEOUT] * 100, max_restarts=0).restart
    assert not decide({}, [C.TIMEOUT] * 101, max_restarts=0).restart  # chained, but never forever


def test_node_failures_and_hangs_exclude_the_node_and_a_partial_entry_keeps_the_other_defaults() -> None:
    assert policy_entry({}, C.NODE_FAIL).exclude_node and policy_entry({}, C.HANG).exclude_node
    assert not policy_entry({}, C.RANK_SIGNAL).exclude_node
    given = policy_entry({C.NODE_FAIL: PolicyEntry(backoff_s=5.0)}, C.NODE_FAIL)
    assert given.exclude_node and given.backoff_s == 5.0, "only the fields the spec sets replace the default"
    assert not policy_entry({C.HANG: PolicyEntry(exclude_node=False)}, C.HANG).exclude_node
    assert policy_entry({C.CANCELLED: PolicyEntry(budget=1)}, C.CANCELLED).action == "give_up"


def test_a_class_budget_and_a_growing_backoff() -> None:
    policy = {C.RANK_EXIT: PolicyEntry(budget=2, backoff_s=2.0, backoff_factor=3.0)}
    assert decide(policy, [C.RANK_EXIT], 10).backoff_s == 2.0
    assert decide(policy, [C.RANK_EXIT, C.HANG, C.RANK_EXIT], 10).backoff_s == 6.0
    gave_up = decide(policy, [C.RANK_EXIT] * 3, 10)
    assert not gave_up.restart and gave_up.reason == "RANK_EXIT: its budget of 2 restart(s) is spent"


def test_the_global_budget_counts_every_class_that_spends_it() -> None:
    assert decide({}, [C.RANK_SIGNAL, C.HANG], max_restarts=2).restart
    spent = decide({}, [C.RANK_SIGNAL, C.HANG, C.RANK_EXIT], max_restarts=2)
    assert not spent.restart and spent.reason == "RANK_EXIT: the restart budget (max_restarts 2) is spent"


def test_the_restarts_left_to_an_elastic_torchrun_count_as_the_policy_counts() -> None:
    """restart.strategy elastic gives each job's torchrun the restarts the run has left. Counted as
    attempts, a preemption and a walltime (which spend nothing) left it 0: torchrun started static,
    with no rounds to measure, and the drill was a resubmit under elastic's name (review)."""
    assert restarts_left({}, [C.PREEMPTED, C.TIMEOUT], 2) == 2
    assert restarts_left({}, [C.RANK_SIGNAL, C.PREEMPTED], 2) == 1
    assert restarts_left({}, [C.RANK_SIGNAL, C.RANK_EXIT, C.HANG], 2) == 0


def test_a_policy_for_an_unknown_class_is_a_spec_error(tmp_path: Path) -> None:
    from orchestrator.campaign.spec import SpecError, load_campaign
    spec = write_spec(tmp_path, restart={"policy": {"HANGG": {"action": "give_up"}}})
    with pytest.raises(SpecError, match="HANGG"):
        load_campaign(spec)


KILL = [{"kind": "kill-rank", "after": {"at_step": 60}, "rank": 1}]


@pytest.mark.drill
def test_a_class_the_policy_gives_up_on_ends_the_run_with_the_class_and_why(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, faults=KILL, restart={"max_restarts": 3, "poll_interval_s": 0.05,
                                                      "policy": {"RANK_SIGNAL": {"action": "give_up"}}})
    run = run_of(drill(spec, expect=1), "r000")
    assert run["status"] == "gave_up" and run["ended_because"] == "RANK_SIGNAL: the policy gives up"
    assert len(run["attempts"]) == 1 and run["attempts"][0]["failure_class"] == "RANK_SIGNAL"


@pytest.mark.drill
def test_a_backoff_delays_the_next_attempt_and_is_part_of_the_time_to_recover(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, faults=KILL, restart={"max_restarts": 3, "poll_interval_s": 0.05,
                                                      "policy": {"RANK_SIGNAL": {"backoff_s": 2.5}}})
    run = run_of(drill(spec), "r000")
    [recovery] = run["recoveries"]
    assert run["status"] == "completed" and recovery["failure_class"] == "RANK_SIGNAL"
    assert recovery["resubmit_s"] >= 2.5


@pytest.mark.drill
def test_a_preemption_restarts_even_with_no_failure_budget_left(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, workload={"framework": "torch", "params": 20000, "steps": 600, "seed": 3,
                                          "batch_size": 16},
                      faults=[{"kind": "preempt", "after": {"at_step": 300}, "grace_s": 20}],
                      restart={"max_restarts": 0, "poll_interval_s": 0.05})
    run = run_of(drill(spec), "r000")
    assert run["status"] == "completed" and [a["failure_class"] for a in run["attempts"]] == ["PREEMPTED", None]
