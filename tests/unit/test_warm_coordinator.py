"""The warm coordinator's decisions over real sockets, with members scripted here (the drills in
test_warm_local.py run it with real ranks): a dead rank's place goes to a warm spare, the state to
the survivor with the highest step, the next generation is fenced as the run's next attempt before
any member hears of it, a spare is started in place of the one used; with no survivor the plan
says checkpoint; a survivor that never reports ends the job (the controller's policy takes over)."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any

import pytest

from experiments.runtime.fault_requests import InjectedRankError
from experiments.warm.coordinator import Coordinator, Placement, SpareNotStarted, Timing
from experiments.warm.member import CoordinatorGone, WarmMember
from experiments.warm.protocol import (
    MAX_LINE_CHARS,
    RESUME_CHECKPOINT,
    RESUME_PEER,
    RESUME_START,
    Line,
    new_secret,
    proof,
)
from experiments.warm.store_host import StoreHost
from warm_scenario import SECRET, Host, start_coordinator, warm_member, within


def test_a_dead_rank_is_replaced_by_a_spare_and_the_survivor_sends_its_state() -> None:
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    first0, first1 = rank0.next_plan(), rank1.next_plan()
    assert (first0.rank, first1.rank, first0.resume, first0.attempt) == (0, 1, RESUME_START, 3)
    assert first0.master_port == 40000 and host.fences == []  # generation 0 is the attempt the controller fenced

    rank1.line.close()  # its process died: the connection ends
    rank0.lost(0, 57)  # the survivor's collective failed after it completed step 57
    second0, taken = rank0.next_plan(), spare.next_plan()
    assert (second0.generation, second0.attempt, second0.rank, taken.rank) == (1, 4, 0, 1)
    assert taken.resume == RESUME_PEER and taken.source_rank == 0 and taken.step == 57
    assert taken.master_port == 40001 and taken.master_addr == "127.0.0.1"
    assert host.fences == [4] and host.order == ["plan 3", "fence 4", "plan 4"]
    # After the plans went out (the recovery first): a new spare in a new slot, in place of the one used.
    assert within(5, lambda: host.spawned == [(3, 4)]), host.spawned
    [(attempt, failure)] = host.named("warm_failure")
    assert attempt == 3 and failure["rank"] == 1 and failure["slot"] == 1 and failure["exit_code"] == -9
    [(_, plan)] = [(a, e) for a, e in host.named("warm_plan") if e["generation"] == 1]
    assert plan["spares_used"] == {"2": 1} and plan["failed_at"] <= plan["time"]

    new_spare = warm_member(address, 3)
    rank0.formed(1)
    spare.formed(1)
    rank0.done()
    spare.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"
    assert new_spare.next_plan() is None, "the run is over: the spare is let go"
    assert [a for a, _ in host.named("warm_formed")] == [4]


def test_with_no_survivor_the_spares_resume_from_the_newest_checkpoint() -> None:
    host = Host()
    _, address, outcome = start_coordinator(host, world=1, spares=1)
    rank0, spare = warm_member(address, 0), warm_member(address, 1)
    assert rank0.next_plan().rank == 0
    rank0.line.close()
    plan = spare.next_plan()
    assert plan.resume == RESUME_CHECKPOINT and plan.source_rank is None and plan.rank == 0 and plan.attempt == 4
    spare.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"


def test_restart_all_retires_the_active_set_and_the_next_warm_set_resumes_from_the_checkpoint() -> None:
    """TensorFlow and Chainer: no survivor keeps its place; a whole spare set (slots 2 and 3, its
    collective formed at launch) takes every rank, from the newest valid checkpoint."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, restart_all=True)
    rank0, rank1, spare0, spare1 = (warm_member(address, slot) for slot in (0, 1, 2, 3))
    assert [rank0.next_plan().resume, rank1.next_plan().resume] == [RESUME_START, RESUME_START]

    rank1.line.close()  # rank 1 died; rank 0 is stuck in a collective that cannot drop it
    taken0, taken1 = spare0.next_plan(), spare1.next_plan()
    assert (taken0.rank, taken1.rank, taken0.attempt, taken0.generation) == (0, 1, 4, 1)
    assert taken0.resume == taken1.resume == RESUME_CHECKPOINT and taken0.source_rank is None
    assert host.ended == [[0]], "the survivor is ended by the host (slot 1 is already gone)"
    assert host.fences == [4]
    assert within(5, lambda: host.spawned == [(4, 4)]), "a new set starts at slot 4, in place of the one used"
    [(_, plan)] = [(a, e) for a, e in host.named("warm_plan") if e["generation"] == 1]
    assert plan["spares_used"] == {"2": 0, "3": 1} and plan["resume"] == RESUME_CHECKPOINT
    rank0.line.close()  # the host ended it: its connection's end is no second failure
    time.sleep(0.2)
    assert [e["rank"] for _, e in host.named("warm_failure")] == [1]

    late = warm_member(address, 4)  # the new set: one member dies before the other is warm
    late_peer = warm_member(address, 5)
    late_peer.line.close()
    assert within(5, lambda: [4] in host.ended), "the rest of a broken set is ended"
    assert within(5, lambda: host.spawned[-1] == (6, 4)), host.spawned
    spare0.done()
    spare1.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"
    late.line.close()


def test_restart_all_takes_the_state_of_the_survivor_with_the_highest_step_and_retires_it_once_formed() -> None:
    """TensorFlow and Chainer without rollback: rank 1 dies; the survivors (world 3) are told to
    hold, answer the step they completed, and serve it; the spare set is planned from the one
    with the highest step (its address and state port in the plan), and the survivors are retired
    only once every rank of the new set took the state (said formed), not before."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=3, spares=1, restart_all=True)
    ports = {0: 41000, 1: 41001, 2: 41002}
    ranks = [warm_member(address, slot, state_port=ports[slot]) for slot in range(3)]
    spares = [warm_member(address, slot, state_port=42000 + slot) for slot in range(3, 6)]
    assert [member.next_plan().rank for member in ranks] == [0, 1, 2]
    ranks[0].answer_holds(lambda: 11)  # its update of step 11 finished before the hold
    ranks[2].answer_holds(lambda: 10)
    ranks[1].line.close()  # rank 1 died; ranks 0 and 2 are blocked in the all-reduce of step 11 (12)

    plans = [member.next_plan() for member in spares]
    assert [plan.rank for plan in plans] == [0, 1, 2]
    assert {(plan.resume, plan.step, plan.source_rank, plan.source_address, plan.source_port) for plan in plans} == {
        (RESUME_PEER, 11, 0, "127.0.0.1", 41000)}
    [(_, event)] = [(a, e) for a, e in host.named("warm_plan") if e["generation"] == 1]
    assert event["resume"] == RESUME_PEER and event["step"] == 11 and event["source_rank"] == 0
    assert host.ended == [], "the sources stay until the new set took their state"
    spares[0].formed(1)
    spares[1].formed(1)
    time.sleep(0.3)
    assert host.ended == [], "one rank of the new set has not taken the state yet"
    spares[2].formed(1)
    assert within(5, lambda: sorted(slot for ended in host.ended for slot in ended) == [0, 2]), host.ended
    ranks[0].line.close()  # the host ended them: no second failure
    ranks[2].line.close()
    time.sleep(0.2)
    assert [e["rank"] for _, e in host.named("warm_failure")] == [1]
    _complete(outcome, *spares)


def _rank_0_dies_rank_1_serves_step_30(host: Host) -> tuple[list[WarmMember], list[WarmMember], dict[str, Any]]:
    """restart_all, world 2, two spare sets (slots 2-5), every member with a state port: rank 0
    dies, rank 1 holds step 30; the first spare set is planned from it (checked here)."""
    _, address, outcome = start_coordinator(
        host, world=2, spares=2, restart_all=True, timing=Timing(report_s=5, spare_s=5, start_s=5, hold_s=0.5))
    ranks = [warm_member(address, slot, state_port=41000 + slot) for slot in range(2)]
    sets = [warm_member(address, slot, state_port=42000 + slot) for slot in range(2, 6)]
    assert [member.next_plan().rank for member in ranks] == [0, 1]
    ranks[1].answer_holds(lambda: 30)
    ranks[0].line.close()
    first = [sets[0].next_plan(), sets[1].next_plan()]
    assert {(plan.resume, plan.step, plan.source_port) for plan in first} == {(RESUME_PEER, 30, 41001)}
    return ranks, sets, outcome


def test_a_set_that_fails_while_taking_the_state_is_followed_by_one_from_the_same_source() -> None:
    """The next set's member dies before its set formed: the survivor still serves (it was not
    retired), the set after takes the same step from it; a survivor that never answers "hold" is
    no source; with no source left, the checkpoint."""
    host = Host()
    ranks, sets, outcome = _rank_0_dies_rank_1_serves_step_30(host)
    sets[1].line.close()  # died while taking the state: its set never formed
    second = [sets[2].next_plan(), sets[3].next_plan()]
    assert {(plan.resume, plan.step, plan.source_port) for plan in second} == {(RESUME_PEER, 30, 41001)}
    sets[2].formed(2)
    sets[3].formed(2)
    assert within(5, lambda: 1 in {slot for ended in host.ended for slot in ended}), host.ended
    _complete(outcome, sets[2], sets[3])
    sets[0].line.close()
    ranks[1].line.close()


def test_a_survivors_lost_report_of_a_generation_already_replaced_is_no_new_failure() -> None:
    """The survivor's collective breaks a moment after the coordinator saw the death and planned
    the next set: its "lost" (of generation 0) must not void the set that is taking its state."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, restart_all=True)
    ranks = [warm_member(address, slot, state_port=41000 + slot) for slot in range(2)]
    spares = [warm_member(address, slot, state_port=42000 + slot) for slot in range(2, 4)]
    assert [member.next_plan().rank for member in ranks] == [0, 1]
    ranks[0].answer_holds(lambda: 5)
    ranks[1].line.close()
    assert {spare.next_plan().generation for spare in spares} == {1}
    ranks[0].lost(0, 5, why="Connection reset by peer")
    time.sleep(0.5)
    assert [e["generation"] for _, e in host.named("warm_plan")] == [0, 1], "no generation 2"
    assert len(host.named("warm_failure")) == 1
    for spare in spares:
        spare.formed(1)
    assert within(5, lambda: [0] in host.ended), host.ended
    _complete(outcome, *spares)
    ranks[0].line.close()


def test_a_source_whose_state_could_not_be_taken_is_no_source_again() -> None:
    """Review: a survivor alive and connected but unable to serve (its port unreachable, its server
    gone) was planned as the source of every later set until the job gave up; the checkpoint was
    never tried. A taker that could not fetch says so in its lost report: that source is dropped."""
    host = Host()
    ranks, sets, outcome = _rank_0_dies_rank_1_serves_step_30(host)
    for member in sets[:2]:  # as spare_set.py does when fetch_state fails
        member.answer_holds(lambda: 0)
        member.lost(1, 0, why="StateNotTaken: connection refused", source_failed=True)
    second = [sets[2].next_plan(), sets[3].next_plan()]
    assert {(plan.resume, plan.source_port) for plan in second} == {(RESUME_CHECKPOINT, 0)}, \
        "the source that could not serve is passed over: the newest valid checkpoint"
    for member in sets[2:]:
        member.formed(2)
    _complete(outcome, *sets[2:])
    for member in (*ranks, *sets[:2]):
        member.line.close()


def test_with_no_survivor_answering_hold_the_next_set_resumes_from_the_checkpoint() -> None:
    host = Host()
    _, address, outcome = start_coordinator(
        host, world=2, spares=1, restart_all=True, timing=Timing(report_s=5, spare_s=5, start_s=5, hold_s=0.3))
    ranks = [warm_member(address, slot, state_port=41000 + slot) for slot in range(2)]
    spares = [warm_member(address, slot, state_port=42000 + slot) for slot in range(2, 4)]
    assert [member.next_plan().rank for member in ranks] == [0, 1]
    ranks[1].line.close()  # rank 0 never answers (hung, or its node is gone)
    plans = [spares[0].next_plan(), spares[1].next_plan()]
    assert {(plan.resume, plan.source_port) for plan in plans} == {(RESUME_CHECKPOINT, 0)}
    spares[0].formed(1)
    spares[1].formed(1)
    assert within(5, lambda: [0] in host.ended), host.ended
    _complete(outcome, *spares)
    ranks[0].line.close()


def test_a_spare_whose_hello_comes_after_the_run_completed_is_let_go() -> None:
    """A spare connected, but its hello reached the coordinator after the spares were released (CI
    saw a test hang on it): it is told to exit (or, still in the listener's backlog at the end, its
    connection is closed): it never waits; once serve returned nobody listens any more."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=1, spares=0)
    rank0 = warm_member(address, 0)
    host_name, port = address.rsplit(":", 1)
    late = Line(socket.create_connection((host_name, int(port)), timeout=5))  # no hello yet
    challenge = late.receive()
    assert rank0.next_plan().rank == 0
    rank0.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"
    asked = time.monotonic()
    try:
        late.send({"op": "hello", "slot": 1, "node": "n1", "address": "127.0.0.1", "pid": 1,
                   "proof": proof(SECRET, challenge["nonce"], 1, 1)})
        answer = late.receive()
    except ConnectionResetError:
        answer = None
    assert answer in ({"op": "exit"}, None) and time.monotonic() - asked < 4, (answer, "it waited")
    with pytest.raises(CoordinatorGone):
        WarmMember(address, slot=2, node="n1", address="127.0.0.1", connect_timeout_s=0.5)


def _complete(outcome: dict[str, Any], *active: WarmMember) -> None:
    """The active members finish the run: the coordinator's verdict is "completed"."""
    for member in active:
        member.done()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "completed"


def _sets(coordinator: Coordinator, address: str, nodes_by_set: list[tuple[str, str]]) -> list[WarmMember]:
    """restart_all, world 2: set k's members (slots 2k, 2k+1) on its two nodes, all warm (their
    hellos in) before any fault, as spare sets are long before one."""
    members = [warm_member(address, 2 * number + rank, node) for number, nodes in enumerate(nodes_by_set)
               for rank, node in enumerate(nodes)]
    assert within(5, lambda: len(coordinator.members) == len(members))
    return members


def test_after_a_node_crash_the_spare_set_clear_of_that_node_takes_over_and_new_sets_avoid_it() -> None:
    """Spare nodes in the allocation: set 1 shares n2 with the ranks, set 2 sits on the spare n3.
    n2 crashes: the rank there is seen dead first (set 1's member on n2 seconds later); set 2 takes
    every rank, and the spares started after avoid n2 once every member there is gone."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=2, restart_all=True)
    members = _sets(coordinator, address, [("n1", "n2"), ("n1", "n2"), ("n1", "n3")])
    assert [members[0].next_plan().rank, members[1].next_plan().rank] == [0, 1]
    members[1].line.close()  # n2 crashed: the rank's connection ends first
    taken = [members[4].next_plan(), members[5].next_plan()]
    assert [plan.rank for plan in taken] == [0, 1] and taken[0].resume == RESUME_CHECKPOINT
    [(_, plan)] = [(a, e) for a, e in host.named("warm_plan") if e["generation"] == 1]
    assert plan["spares_used"] == {"4": 0, "5": 1}, "the set clear of the crashed node, not the lowest"
    members[3].line.close()  # set 1's member on n2, seconds later: set 1 is broken, its n1 member retired
    assert within(5, lambda: [2] in host.ended), host.ended
    assert within(5, lambda: any(p.avoid == frozenset({"n2"}) for p in host.placements)), host.placements
    _complete(outcome, members[4], members[5])


def test_a_node_whose_only_other_members_were_retired_is_lost_when_its_members_die() -> None:
    """A first SIGKILL (rank 0, on n1) retires rank 1 on n2; then n2 crashes under the next set: the
    member retired there earlier is no sign of life, so the spares started after avoid n2."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=2, restart_all=True)
    members = _sets(coordinator, address, [("n1", "n2"), ("n1", "n2"), ("n1", "n3")])
    assert [members[0].next_plan().rank, members[1].next_plan().rank] == [0, 1]
    members[0].line.close()  # rank 0 SIGKILLed on n1: every set touches n1, the lowest one takes over
    assert [members[2].next_plan().rank, members[3].next_plan().rank] == [0, 1]
    assert within(5, lambda: [1] in host.ended), host.ended
    members[1].line.close()  # the host ended it (retired on n2)
    members[3].line.close()  # n2 crashes: the active rank there dies
    assert [members[4].next_plan().rank, members[5].next_plan().rank] == [0, 1]
    assert within(5, lambda: any(p.avoid == frozenset({"n2"}) for p in host.placements)), host.placements
    _complete(outcome, members[4], members[5])


def test_when_no_spare_set_is_left_or_can_start_the_job_gives_up_at_once() -> None:
    """No spare node: n2 crashed with the ranks' and the only spare set's members on it; a new set
    cannot be placed (the host refuses), and a launch that ended without a word is none on its way:
    the job gives up now (the controller resubmits without the node), not after spare_s."""
    host = Host()

    def refuse_lost_nodes(slot: int, attempt: int, where: Placement) -> None:
        host.spawn(slot, attempt, where)
        if where.avoid:
            raise SpareNotStarted(f"a spare set needs 2 node(s); lost: {sorted(where.avoid)}")

    coordinator, address, outcome = start_coordinator(host, world=2, spares=1, restart_all=True, spawn=refuse_lost_nodes,
                                           timing=Timing(report_s=5, spare_s=60, start_s=5))
    members = _sets(coordinator, address, [("n1", "n2"), ("n1", "n2")])
    assert [members[0].next_plan().rank, members[1].next_plan().rank] == [0, 1]
    started = time.monotonic()
    members[3].line.close()  # the spare set's member on n2 first: a new set is started (n2 not lost yet)
    assert within(5, lambda: bool(host.spawned) and host.spawned[-1][0] == 4), host.spawned
    coordinator.launch_ended([4, 5])  # its launch failed on the dead node before anyone said hello
    members[1].line.close()  # then the rank on n2
    outcome["thread"].join(timeout=10)
    assert "no warm spare set" in outcome.get("gave_up", "") and "n2" in outcome["gave_up"], outcome
    assert time.monotonic() - started < 10, "it did not wait out spare_s (60 s)"


def test_a_survivor_that_never_reports_its_step_ends_the_job() -> None:
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, timing=Timing(report_s=0.5, spare_s=5, start_s=5))
    rank0, rank1, _spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank1.line.close()  # rank 0 is hung: it never says which step it completed
    outcome["thread"].join(timeout=10)
    assert "did not report the step it completed" in outcome.get("gave_up", "")


@pytest.mark.parametrize("message", [
    # gloo, recorded on this machine: a peer SIGKILLed, a peer on a node that lost power (no FIN/RST).
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.213.77.12]:40231: Connection reset by peer",
    "Application timeout caused pair closure",
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation",
])
@pytest.mark.drill  # the warm runner imports torch
def test_what_gloo_says_of_a_lost_peer_re_forms_the_group(message: str) -> None:
    from experiments.warm.runner import peer_lost

    assert peer_lost(RuntimeError(message))


@pytest.mark.parametrize("error", [RuntimeError("mat1 and mat2 shapes cannot be multiplied (16x3 and 4x8)"),
                                   ValueError("Application timeout caused pair closure"),
                                   # review: a rank-error's own message was read as a lost peer's
                                   InjectedRankError("NCCL watchdog timeout (simulated)"),
                                   InjectedRankError("simulated gloo failure: peer gradients diverged")])
@pytest.mark.drill  # the warm runner imports torch
def test_a_ranks_own_error_is_not_taken_for_a_lost_peer(error: Exception) -> None:
    from experiments.warm.runner import peer_lost

    assert not peer_lost(error)


def test_more_deaths_than_spares_start_the_missing_spares_at_once_and_the_job_goes_on() -> None:
    """Hardening issue, item 16: two ranks of three die with one spare held. The missing spare is
    started at once (before any plan: the re-formation waits for it), not after spare_s."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=3, spares=1, timing=Timing(report_s=5, spare_s=60, start_s=5))
    rank0, rank1, rank2, spare = (warm_member(address, slot) for slot in (0, 1, 2, 3))
    assert [m.next_plan().rank for m in (rank0, rank1, rank2)] == [0, 1, 2]
    rank1.line.close()
    rank2.line.close()
    rank0.lost(0, 40)
    assert within(5, lambda: host.spawned[:1] == [(4, 3)]), f"no spare started for the second death: {host.spawned}"
    assert not [e for _, e in host.named("warm_plan") if e["generation"] == 1], "a plan before the spares were warm"
    late = warm_member(address, 4, node="n2")
    plans = [m.next_plan() for m in (rank0, spare, late)]
    assert [(p.generation, p.rank, p.resume) for p in plans] == [(1, 0, RESUME_PEER), (1, 1, RESUME_PEER),
                                                                 (1, 2, RESUME_PEER)]
    assert within(5, lambda: len(host.spawned) == 2), "the spare held is started again after the plan"
    _complete(outcome, rank0, spare, late)


def test_ranks_that_saved_on_the_schedulers_warning_hold_and_nothing_re_forms() -> None:
    """Hardening issue, item 14: a warm job's ranks save on the warning and hold; their ends (the
    scheduler ends the job, or their hold runs out) are no failure: no spare takes a rank."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    assert [rank0.next_plan().rank, rank1.next_plan().rank] == [0, 1]
    rank0.warned(0, 120)
    rank1.warned(0, 120)
    rank0.line.close()
    time.sleep(0.3)
    assert outcome["thread"].is_alive(), "the coordinator ended while a warned rank still held"
    rank1.line.close()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict") == "warned: the ranks saved step 120 on the scheduler's warning", outcome
    assert spare.next_plan() is None, "a spare was planned in after the warning"
    assert host.named("warm_failure") == [] and len(host.named("warm_plan")) == 1 and host.fences == []


def test_a_spare_that_dies_before_its_generation_formed_voids_it_and_another_is_planned_in() -> None:
    """Hardening issue, item 15: the spare planned in for a dead rank dies in the rendezvous. The
    survivor's join gives up after the plan's join timeout and reports lost; the next plan takes
    the other warm spare (the job does not give up with a spare idle)."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=2, timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=2))
    rank0, rank1, first, second = (warm_member(address, slot) for slot in (0, 1, 2, 3))
    assert [rank0.next_plan().join_timeout_s, rank1.next_plan().join_timeout_s] == [None, None]
    rank1.line.close()
    rank0.lost(0, 30)
    survivor, taken = rank0.next_plan(), first.next_plan()
    assert (survivor.generation, taken.rank, survivor.join_timeout_s) == (1, 1, 2)
    first.line.close()  # died before the group formed
    rank0.lost(1, 30)  # its join gave up after join_timeout_s
    again, second_taken = rank0.next_plan(), second.next_plan()
    assert (again.generation, again.attempt, second_taken.rank, second_taken.resume) == (2, 5, 1, RESUME_PEER)
    assert second_taken.source_rank == 0 and second_taken.step == 30
    _complete(outcome, rank0, second)


def test_a_spare_that_never_took_the_state_is_no_source_the_checkpoint_is() -> None:
    """The survivor dies in the rendezvous of the generation that planned a spare in: the spare
    holds nothing (it reports step 0), so the next plan resumes from the newest checkpoint."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=2, timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=2))
    rank0, rank1, first, second = (warm_member(address, slot) for slot in (0, 1, 2, 3))
    rank0.next_plan(), rank1.next_plan()
    rank1.line.close()
    rank0.lost(0, 30)
    assert (rank0.next_plan().generation, first.next_plan().rank) == (1, 1)
    rank0.line.close()  # the survivor died before the group formed
    first.lost(1, 0)  # the spare's join gave up; it never took the state
    plans = [first.next_plan(), second.next_plan()]
    assert {(p.generation, p.resume, p.source_rank) for p in plans} == {(2, RESUME_CHECKPOINT, None)}, plans
    _complete(outcome, first, second)


def test_a_spare_whose_launch_ended_before_its_hello_is_started_again_a_bounded_number_of_times() -> None:
    """Hardening issue, item 20: a spare that died before it said hello was never replaced (the job
    held fewer spares than it was given); one whose node is down fails at once: not forever."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=1, spares=1)
    rank0 = warm_member(address, 0)
    assert rank0.next_plan().rank == 0
    coordinator.launch_ended([1])  # the first spare (slot 1) died before its hello
    assert host.spawned == [(2, 3)]
    for slot in (2, 3, 4):
        coordinator.launch_ended([slot])
    assert [slot for slot, _ in host.spawned] == [2, 3, 4], "replaced without end"
    _complete(outcome, rank0)


def _stranger(address: str, slot: int, secret: str | None = None, pid: int = 4242) -> Line:
    """A connection that answers the challenge as a member would, with ``secret`` (None: a guess)."""
    host_name, port = address.rsplit(":", 1)
    line = Line(socket.create_connection((host_name, int(port)), timeout=5))
    challenge = line.receive()
    assert challenge is not None and challenge["op"] == "challenge"
    line.send({"op": "hello", "slot": slot, "node": "evil", "address": "10.6.6.6", "pid": pid,
               "proof": proof(secret or new_secret(), challenge["nonce"], slot, pid)})
    return line


def _closed(line: Line) -> bool:
    try:
        return line.receive() is None
    except (ConnectionResetError, OSError):
        return True


def test_strangers_are_refused_and_counted_and_the_real_spare_takes_the_dead_ranks_place() -> None:
    """Security issue 28, item 1: hellos without the job's secret (slot 7, slot -1, which sorted
    before the real spare), one with it for a slot the job never launched, and one for slot 0,
    which replaced rank 0's record: each refused and counted; a rank's death plans the real spare."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    strangers = [_stranger(address, 7), _stranger(address, -1), _stranger(address, 9, SECRET),
                 _stranger(address, 0, SECRET)]
    assert all(_closed(line) for line in strangers)
    assert [rank0.next_plan().rank, rank1.next_plan().rank] == [0, 1]
    assert coordinator.refused == 4 and coordinator.members[0].pid == os.getpid()
    refused = {event["slot"]: event for _, event in host.named("warm_refused")}  # in the order handled
    assert sorted(refused) == [-1, 0, 7, 9], refused
    assert "secret" in refused[7]["why"] and "secret" in refused[-1]["why"], refused
    assert "not launched" in refused[9]["why"] and "held" in refused[0]["why"], refused
    rank1.line.close()
    rank0.lost(0, 12)
    assert spare.next_plan().rank == 1 and rank0.next_plan().generation == 1
    _complete(outcome, rank0, spare)


def test_a_line_without_end_or_a_malformed_message_ends_that_connection_not_the_coordinator() -> None:
    """Item 1: lines were read without bound, and a malformed line killed the member's thread
    without its death being seen: now a real member's malformed message is its end (a failure)."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=1)
    host_name, port = address.rsplit(":", 1)
    flood = Line(socket.create_connection((host_name, int(port)), timeout=5))
    flood.receive()
    flood.connection.sendall(b"x" * (MAX_LINE_CHARS + 10))
    assert _closed(flood) and within(5, lambda: coordinator.refused == 1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank1.line.connection.sendall(b"[1, 2]\n")  # a rank that says nonsense is taken as gone
    assert within(5, lambda: [e["rank"] for _, e in host.named("warm_failure")] == [1]), host.events
    rank0.lost(0, 3)
    assert spare.next_plan().rank == 1
    _complete(outcome, rank0, spare)


def test_a_rank_that_dies_while_its_peers_hold_on_the_warning_is_no_warm_failure() -> None:
    """Review of item 14: rank 0 held on the warning, rank 1 died before it said so: that wrote a
    warm_failure with no plan after it, which the controller followed as a re-formation."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=1)
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank0.warned(0, 80)
    # Each member's messages are read by a thread of its own: rank 1's end only after rank 0's word.
    assert within(5, lambda: coordinator.members[0].role == "warned")
    rank1.line.close()
    rank0.line.close()
    outcome["thread"].join(timeout=10)
    assert outcome.get("verdict", "").startswith("warned") and host.named("warm_failure") == [], host.events
    assert spare.next_plan() is None


def test_spares_whose_launches_ended_together_are_one_failed_launch() -> None:
    """Review of item 20: the local host reports every slot that ended within one look at once."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=1, spares=3)
    rank0 = warm_member(address, 0)
    rank0.next_plan()
    coordinator.launch_ended([1, 2, 3])
    assert [slot for slot, _ in host.spawned] == [4, 5, 6]
    _complete(outcome, rank0)


def test_a_rank_whose_connection_ended_before_the_first_plan_is_a_failure_a_spare_takes_its_place() -> None:
    """Message-loss harness (issue 21): a rank that died after its hello, before the first plan, was
    planned as if alive (no warm_failure); the coordinator then waited for its step as a survivor's
    and gave up. Its end is the first generation's failure: the warm spare takes its place."""
    host = Host()
    coordinator, address, outcome = start_coordinator(host, world=2, spares=1,
                                                      timing=Timing(report_s=1, spare_s=5, start_s=5))
    spare, rank1 = warm_member(address, 2), warm_member(address, 1)
    rank1.line.close()
    assert within(5, lambda: 1 in coordinator.members and coordinator.members[1].role == "gone")
    rank0 = warm_member(address, 0)
    rank0.line.connection.settimeout(3)
    assert rank0.next_plan().generation == 0
    rank0.lost(0, 0)  # its rendezvous gave up: rank 1 never joined
    plans = [rank0.next_plan(), spare.next_plan()]
    assert [(p.generation, p.rank, p.resume) for p in plans] == [(1, 0, RESUME_CHECKPOINT), (1, 1, RESUME_CHECKPOINT)]
    [(attempt, failure)] = host.named("warm_failure")
    assert (attempt, failure["generation"], failure["rank"], failure["slot"]) == (3, 0, 1, 1)
    _complete(outcome, rank0, spare)


def test_a_generation_that_failed_with_no_rank_dead_is_told_to_the_controller_as_a_failure() -> None:
    """Hardening issue (the full run's warm livelock): a re-formation whose rendezvous failed on every
    member, none dead, was re-planned without a warm_failure event: the controller never saw the
    attempt fail, its restart budget was never spent, and the job re-formed every 10 s for 10 min.
    Each such failure is the attempt's warm_failure (the policy counts it), with the members' words."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=2))
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank0.formed(0), rank1.formed(0)
    rank0.lost(0, 12, why="gloo: Timed out waiting 10000ms for recv")  # a hang: no connection ended
    rank1.lost(0, 12, why="gloo: Timed out waiting 10000ms for recv")
    assert (rank0.next_plan().generation, rank1.next_plan().generation) == (1, 1)
    [(attempt, failure)] = host.named("warm_failure")
    assert attempt == 3 and failure["exit_code"] == -1 and failure["rank"] == 0
    assert "no rank died" in failure["what"] and "Timed out waiting 10000ms" in failure["what"], failure
    _complete(outcome, rank0, rank1)
    spare.line.close()


def test_generations_that_never_form_end_the_job_instead_of_re_forming_forever() -> None:
    """Three re-formations in a row whose rendezvous failed (none formed): the coordinator gives up
    (the job fails, the controller's policy takes over), each told to the controller first."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=2))
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    rank0.next_plan(), rank1.next_plan()
    rank0.formed(0), rank1.formed(0)
    for generation in range(4):
        rank0.lost(generation, 12, why="TCPStore: waitForInput timed out")
        rank1.lost(generation, 12, why="TCPStore: waitForInput timed out")
        if generation < 3:
            assert (rank0.next_plan().generation, rank1.next_plan().generation) == (generation + 1,) * 2
    outcome["thread"].join(timeout=10)
    assert "did not form" in str(outcome.get("gave_up")), outcome
    assert [attempt for attempt, _ in host.named("warm_failure")] == [3, 4, 5, 6]
    spare.line.close()


@pytest.mark.drill  # torch's store
def test_a_rank_that_dies_in_a_rendezvous_ends_the_others_wait_on_its_store_at_once() -> None:
    """The coordinator hosts each generation's rendezvous store (PyTorch): a member that dies while
    the generation forms voids it, and its store ends, so a survivor waiting there raises now,
    not at its join's timeout (it waited 15 s on the dead rank 0's store, each such kill)."""
    from torch.distributed import DistError, TCPStore

    host = Host()
    stores = StoreHost("127.0.0.1")
    _, address, outcome = start_coordinator(host, world=2, spares=1, stores=stores,
                                            timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=30, void_again_s=60))
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    first = rank0.next_plan()
    rank1.next_plan()
    assert first.store_hosted and first.master_addr == "127.0.0.1" and first.master_port != 40000
    waiting = TCPStore(first.master_addr, first.master_port, 2, False, timedelta(seconds=30))
    waiting.set("rank 0 is here", "1")
    started = time.monotonic()
    rank1.line.close()  # rank 1 died before it joined
    with pytest.raises(DistError):
        waiting.wait(["rank 1 is here"])  # as gloo's rendezvous waits on its peer's address
    assert time.monotonic() - started < 5, "the survivor waited for its timeout"
    rank0.lost(0, 0, why="the store ended")
    again, taken = rank0.next_plan(), spare.next_plan()
    assert again.master_port != first.master_port and again.generation == taken.generation == 1
    fresh = TCPStore(again.master_addr, again.master_port, 2, False, timedelta(seconds=5))
    fresh.set("reachable", "1")  # the next generation's store is up
    _complete(outcome, rank0, spare)


@pytest.mark.drill  # torch's store
def test_a_member_that_reaches_a_voided_rendezvous_late_is_let_go_within_seconds() -> None:
    """A member whose store connection comes after its generation was voided (it got its plan, the
    kill came before it connected) is let go too: the voided store answers its port afresh, and the
    coordinator ends its connections again each second until every survivor has reported. A store
    that was only closed left such a member retrying its connection for its whole timeout (17-31 s
    measured for a 15 s join; the coordinator gives up on a survivor after 30 s)."""
    from torch.distributed import DistError, TCPStore

    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=1, stores=StoreHost("127.0.0.1"),
                                            timing=Timing(report_s=20, spare_s=5, start_s=5, reform_s=30))
    rank0, rank1, spare = (warm_member(address, slot) for slot in (0, 1, 2))
    first = rank0.next_plan()
    rank1.next_plan()
    rank1.line.close()  # rank 1 died before anyone joined: generation 0 is void
    assert within(5, lambda: bool(host.named("warm_failure")))
    started = time.monotonic()
    with pytest.raises(DistError):
        late = TCPStore(first.master_addr, first.master_port, 2, False, timedelta(seconds=30))
        late.wait(["rank 1 is here"])
    assert time.monotonic() - started < 5, "the late member waited for its timeout"
    rank0.lost(0, 0, why="the store ended")
    again, taken = rank0.next_plan(), spare.next_plan()
    assert again.generation == taken.generation == 1
    with pytest.raises(DistError):  # generation 0's store is gone once generation 1 is planned
        TCPStore(first.master_addr, first.master_port, 2, False, timedelta(seconds=1))
    _complete(outcome, rank0, spare)


@pytest.mark.drill  # torch's store
def test_a_lost_report_with_no_rank_dead_voids_the_generations_store() -> None:
    """A hang: a member's collective timed out, no connection ended. Its report voids the store, so
    a member still waiting in the rendezvous stops waiting now."""
    from torch.distributed import DistError, TCPStore

    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=0, stores=StoreHost("127.0.0.1"),
                                            timing=Timing(report_s=20, spare_s=5, start_s=5, reform_s=30, void_again_s=60))
    rank0, rank1 = (warm_member(address, slot) for slot in (0, 1))
    first = rank0.next_plan()
    rank1.next_plan()
    waiting = TCPStore(first.master_addr, first.master_port, 2, False, timedelta(seconds=30))
    started = time.monotonic()
    rank0.lost(0, 7, why="gloo: Timed out waiting 10000ms")
    with pytest.raises(DistError):
        waiting.wait(["never set"])
    assert time.monotonic() - started < 5, "the member waited for its timeout"
    rank1.lost(0, 7, why="the store ended")
    assert rank0.next_plan().generation == rank1.next_plan().generation == 1
    _complete(outcome, rank0, rank1)


def test_a_generation_that_forms_starts_the_count_of_unformed_ones_again() -> None:
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=0, timing=Timing(report_s=5, spare_s=5, start_s=5, reform_s=2))
    rank0, rank1 = (warm_member(address, slot) for slot in (0, 1))
    rank0.next_plan(), rank1.next_plan()
    formed = {0, 2}  # generations 1, 3, 4 and 5 never form: only the last three in a row end the job
    for generation in range(6):
        if generation in formed:
            rank0.formed(generation), rank1.formed(generation)
        rank0.lost(generation, 12)
        rank1.lost(generation, 12)
        if generation < 5:
            assert (rank0.next_plan().generation, rank1.next_plan().generation) == (generation + 1,) * 2
    outcome["thread"].join(timeout=10)
    assert "generations 3 to 5 did not form" in str(outcome.get("gave_up")), outcome


def test_a_survivor_that_dies_while_the_re_formation_waits_for_a_spare_is_not_planned_in() -> None:
    """A second failure during the recovery: the survivor dies while the re-formation waits for the
    spare it lacked. It was planned into the next generation all the same (its role reset to active,
    its state named the source): the spare waited on a dead peer and the job gave up. Now the
    re-formation counts its survivors again once the spare is there: none is left, so two spares
    take both ranks, from the newest valid checkpoint."""
    host = Host()
    _, address, outcome = start_coordinator(host, world=2, spares=0,
                                            timing=Timing(report_s=5, spare_s=10, start_s=5, reform_s=2))
    rank0, rank1 = (warm_member(address, slot) for slot in (0, 1))
    rank0.next_plan(), rank1.next_plan()
    rank1.line.close()
    rank0.lost(0, 12)
    assert within(5, lambda: [slot for slot, _ in host.spawned] == [2]), host.spawned
    rank0.line.close()  # the survivor dies while its spare starts
    assert within(5, lambda: [e["rank"] for _, e in host.named("warm_failure")] == [1, 0]), host.events
    first = warm_member(address, 2)
    assert within(5, lambda: [slot for slot, _ in host.spawned] == [2, 3]), host.spawned
    second = warm_member(address, 3)
    plans = [first.next_plan(), second.next_plan()]
    assert {(p.generation, p.resume, p.source_rank) for p in plans} == {(1, RESUME_CHECKPOINT, None)}, plans
    assert sorted(p.rank for p in plans) == [0, 1]
    _complete(outcome, first, second)


def test_a_store_that_cannot_start_ends_the_job_saying_why() -> None:
    """The coordinator's store for the first generation cannot start (no torch there, no port): the
    job gives up with the reason, instead of a traceback and no verdict."""
    class Broken(StoreHost):
        def open(self, generation: int) -> int:
            raise OSError(98, "Address already in use")

    host = Host()
    _, address, outcome = start_coordinator(host, world=1, spares=0, stores=Broken("127.0.0.1"))
    outcome["thread"].join(timeout=10)
    assert "generation 0's rendezvous store could not start" in str(outcome.get("gave_up")), outcome
    assert "Address already in use" in str(outcome.get("gave_up"))
