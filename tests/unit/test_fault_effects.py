"""Issue 23, item 1: a fault is checked against the run's own records, never taken on the injector's
word. Recorded heartbeats of two ranks (a step each 10 ms, a beat each 50 ms, as the rank runtime
writes them), the fault's ledger row and the recovery after it: a SIGKILL whose target beat on
after it (a wrapper took the signal, the trainer went on), a resume from a step its attempt could
not have reached by the fault (a checkpoint an orphan wrote), a run whose ranks did not exit after
their final record; and the faults that did what they are for, verified."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from experiments.layout import RunPaths, append_json_line, write_json_atomic
from experiments.runtime.identity import RankIdentity
from orchestrator.record.clocks import AttemptClocks, ClockReading, save_clocks
from orchestrator.record.effects import INEFFECTIVE, SUSPICIOUS, RunEvidence, verify_run
from orchestrator.record.ledger import AttemptRow, FaultRow, RecoveryRow

pytestmark = pytest.mark.unit

KILL_AT = 102.0  # two seconds into attempt 0: both ranks at step 200
STEP_S, BEAT_S = 0.01, 0.05


def _identity(paths: RunPaths, attempt: int, rank: int, node: str) -> None:
    write_json_atomic(paths.rank_file(attempt, rank), asdict(RankIdentity(
        rank=rank, pid=1000 + rank, create_time=0.0, host=node, node=node, job_id=str(attempt + 1), attempt=attempt)))


def _beats(paths: RunPaths, attempt: int, rank: int, start: float, until: float, first_step: int = 0,
           offset: float = 0.0) -> None:
    """A beat every BEAT_S from ``start`` to ``until`` (true time; stamped ``offset`` ahead), a step each STEP_S."""
    moment = start
    while moment <= until + 1e-9:
        step = first_step + round((moment - start) / STEP_S)
        append_json_line(paths.heartbeat_file(attempt, rank), {"attempt": attempt, "step": step, "time": moment + offset})
        moment += BEAT_S


def _run(tmp_path: Path, nodes: tuple[str, str] = ("n1", "n2")) -> RunPaths:
    paths = RunPaths(tmp_path / "r000")
    for attempt in (0, 1):
        for rank, node in enumerate(nodes):
            _identity(paths, attempt, rank, node)
    return paths


def _kill(rank: int = 1, node: str = "n2", signal: str = "SIGKILL", kind: str = "kill-rank",
          target: str | None = None) -> FaultRow:
    return FaultRow(fault_id=1, run_id="r000", attempt=0, plan_index=0, kind=kind,
                    target=target or f"rank {rank}@{node}", signal=signal, planned_delay_s=2.0, at=KILL_AT, pid=4242,
                    node=node, outcome="injected", detail="caused: attempt 0 failed", met_step=200)


def _recovery(resumed_from: int, state_source: str | None = None) -> RecoveryRow:
    return RecoveryRow(run_id="r000", attempt=1, fault_kind="kill-rank", fault_at=KILL_AT, detect_s=0.2,
                       resubmit_s=0.1, queue_s=0.1, startup_s=3.0, load_s=0.1, first_step_s=0.05, ttr_s=3.55,
                       lost_steps=max(0, 200 - resumed_from), lost_s=0.0, lost_rank_s=0.0,
                       resumed_from_step=resumed_from, state_source=state_source)


def _attempts(reason: str | None = None) -> list[AttemptRow]:
    return [AttemptRow("r000", 0, "1", "FAILED", 99.0), AttemptRow("r000", 1, "2", "COMPLETED", 104.0, reason=reason)]


def _verify(paths: RunPaths, fault: FaultRow, recovery: RecoveryRow | None = None,
            reason: str | None = None) -> tuple[list[str], list[dict[str, object]]]:
    effects, findings = verify_run(RunEvidence(paths, 2, [fault], [recovery] if recovery else [], _attempts(reason)))
    return effects, [finding.to_dict() for finding in findings]


def test_a_kill_whose_ranks_stopped_and_whose_resume_came_from_before_it_is_verified(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    for rank in (0, 1):
        _beats(paths, 0, rank, 100.0, KILL_AT - 0.01)
    effects, findings = _verify(paths, _kill(), _recovery(resumed_from=150))
    assert findings == [] and effects == ["verified: its target made no progress after it"], (effects, findings)


def test_a_kill_whose_target_trained_on_is_ineffective(tmp_path: Path) -> None:
    """The SIGKILL hit a wrapper: rank 1's trainer beat on for another second (through the rank API)."""
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT + 1.0)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)
    effects, findings = _verify(paths, _kill(), _recovery(resumed_from=200))
    [finding] = findings
    assert finding["verdict"] == INEFFECTIVE and finding["fault"] == 0, finding
    assert "rank 1 trained on after the kill-rank (SIGKILL)" in str(finding["what"]), finding
    assert "it had reached step 200" in str(finding["what"]) and effects[0].startswith(INEFFECTIVE)


def test_a_resume_from_a_step_the_attempt_could_not_have_reached_by_the_kill_is_ineffective(tmp_path: Path) -> None:
    """Zero-code: the wrapper died with its supervisor (no beat after the kill), the orphaned trainer
    wrote checkpoints to step 600, and the next attempt resumed from it: 'lost steps 0' was wrong."""
    paths = _run(tmp_path)
    save_clocks(paths.clocks_file(0), AttemptClocks(readings={"n1": ClockReading(0.0, 0.002, 16, 100.0),
                                                              "n2": ClockReading(0.0, 0.002, 16, 100.0)}))
    for rank in (0, 1):
        _beats(paths, 0, rank, 100.0, KILL_AT - 0.01)
    _, findings = _verify(paths, _kill(), _recovery(resumed_from=600))
    [finding] = findings
    assert finding["verdict"] == INEFFECTIVE and "attempt 1 resumed from step 600" in str(finding["what"]), finding
    # the bound: the last beat (step 199 at 101.99) plus the pace (100 steps/s) over the time since,
    # to the fault's moment and its allowance (0.2 s, and both clocks' uncertainty)
    bound = int(str(finding["what"]).split("at most step ")[1].split(")")[0])
    assert 200 <= bound <= 230, finding
    _, within = _verify(paths, _kill(), _recovery(resumed_from=200))
    assert within == [], "a checkpoint of the step the kill met is the attempt's own"


def test_a_warm_recovery_from_a_survivors_state_is_not_taken_for_a_resume_past_the_fault(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    for rank in (0, 1):
        _beats(paths, 0, rank, 100.0, KILL_AT - 0.01)
    assert _verify(paths, _kill(), _recovery(resumed_from=260, state_source="peer"))[1] == []


def test_a_caught_signal_is_not_checked_and_a_sigstop_is(tmp_path: Path) -> None:
    """SIGTERM may be handled (a checkpoint, then on): not checked. A SIGSTOP whose rank beat on is ineffective."""
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT + 1.0)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)
    effects, findings = _verify(paths, _kill(signal="SIGTERM"))
    assert (effects, findings) == ([""], [])
    _, findings = _verify(paths, _kill(signal="SIGSTOP", kind="hang-rank"))
    assert [finding["verdict"] for finding in findings] == [INEFFECTIVE]


def test_a_launcher_kill_checks_every_rank_on_its_node(tmp_path: Path) -> None:
    """torchrun killed, its workers trained on: the ranks of the launcher's node, both of them."""
    paths = _run(tmp_path, nodes=("n1", "n1"))
    _beats(paths, 0, 0, 100.0, KILL_AT + 1.0)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)
    fault = FaultRow(**{**asdict(_kill(rank=0, node="n1")), "detail": "the launcher (pid 77) of the ranks"})
    _, findings = _verify(paths, fault)
    assert sorted(str(finding["what"]).split(" trained on")[0].rsplit(" ", 1)[1] for finding in findings) == ["0", "1"]


def test_a_node_crash_stamped_on_the_login_clock_reads_the_nodes_beats_through_its_offset(tmp_path: Path) -> None:
    """n2 is 1.3 s ahead: its last beats before the crash are stamped 'after' it as read, and are not
    progress after it; a beat 3 s after it (past the 2 s its command may take), on its own clock, is."""
    paths = _run(tmp_path)
    save_clocks(paths.clocks_file(0), AttemptClocks(readings={"n1": ClockReading(0.0, 0.002, 16, 100.0),
                                                              "n2": ClockReading(1.3, 0.002, 16, 100.0)}))
    _beats(paths, 0, 0, 100.0, KILL_AT - 0.01)
    _beats(paths, 0, 1, 100.0, KILL_AT - 0.01, offset=1.3)
    crash = _kill(kind="node-crash", target="node n2", signal="")
    effects, findings = _verify(paths, crash)
    assert findings == [] and effects[0].startswith("verified"), (effects, findings)
    _beats(paths, 0, 1, KILL_AT + 3.0, KILL_AT + 3.0, first_step=400, offset=1.3)
    [finding] = _verify(paths, crash)[1]
    assert "rank 1 trained on after the node-crash" in str(finding["what"]), finding


def test_ranks_that_did_not_exit_after_their_final_record_are_suspicious(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    reason = ("attempt 1 wrote its final record; its ranks did not exit within restart.finish_timeout_s = 120")
    effects, findings = _verify(paths, _kill(), reason=reason)
    assert [finding["verdict"] for finding in findings] == [SUSPICIOUS], findings
    assert "outlived its training" in str(findings[0]["what"])


def test_a_stall_whose_target_trained_on_while_stopped_is_ineffective_and_one_that_stood_still_verified(
        tmp_path: Path) -> None:
    """stall-rank: SIGSTOP, then SIGCONT after its duration (the record: "stopped for 3.00 s"). Beats
    after the SIGCONT are the run going on; beats while it was to stand still are not."""
    paths = _run(tmp_path)
    stall = FaultRow(**{**asdict(_kill(kind="stall-rank", signal="SIGSTOP")), "detail": "stopped for 3.00 s, then SIGCONT"})
    _beats(paths, 0, 1, 100.0, KILL_AT - 0.01)
    _beats(paths, 0, 1, KILL_AT + 3.05, KILL_AT + 5.0, first_step=200)  # continued: goes on
    effects, findings = verify_run(RunEvidence(paths, 2, [stall], [], _attempts()))
    assert findings == [] and effects[0].startswith("verified"), (effects, findings)
    _beats(paths, 0, 1, KILL_AT + 1.0, KILL_AT + 2.0, first_step=300)  # trained while it was to stand still
    _, findings = verify_run(RunEvidence(paths, 2, [stall], [], _attempts()))
    assert [finding.verdict for finding in findings] == [INEFFECTIVE], findings


def test_a_stall_whose_steps_are_told_only_once_continued_is_caught_by_the_jump(tmp_path: Path) -> None:
    """Zero-code behind a wrapper: the stall stopped the wrapper and the log it shows, the trainer
    trained on; once continued, the supervisor writes what the log says: 300 steps further within a
    tenth of a second."""
    paths = _run(tmp_path)
    stall = FaultRow(**{**asdict(_kill(kind="stall-rank", signal="SIGSTOP")), "detail": "stopped for 3.00 s, then SIGCONT"})
    _beats(paths, 0, 1, 100.0, KILL_AT - 0.01)
    _beats(paths, 0, 1, KILL_AT + 3.05, KILL_AT + 4.0, first_step=500)
    [finding] = verify_run(RunEvidence(paths, 2, [stall], [], _attempts()))[1]
    assert "trained while stopped" in finding.what and "at step 500" in finding.what, finding


def test_a_script_whose_log_comes_in_bursts_is_allowed_a_burst_past_its_last_line(tmp_path: Path) -> None:
    """A script that does not flush its log: the supervisor reads 100 steps at once every second. At
    the kill its last line read said step 200 while it may have trained to 299 and checkpointed at
    250: a resume from 250 is its own; from 600 it is not."""
    paths = _run(tmp_path)
    for rank in (0, 1):
        for second in range(3):  # steps 0, 100, 200 at 99.9, 100.9, 101.9 (each a burst of 100 lines)
            append_json_line(paths.heartbeat_file(0, rank), {"attempt": 0, "step": 100 * second,
                                                             "time": 99.9 + second})
    assert _verify(paths, _kill(), _recovery(resumed_from=250))[1] == []
    [finding] = _verify(paths, _kill(), _recovery(resumed_from=600))[1]
    assert finding["verdict"] == INEFFECTIVE


# --- the review of the effects check (helper 34): each case a correct drill, or a defeated fault ----


def test_a_resume_read_from_a_scripts_first_logged_step_is_allowed_its_logging_interval(tmp_path: Path) -> None:
    """Zero-code, a log line every 100 steps and a checkpoint every 100: the kill at ~250, the script
    reloads 200 and logs 300 first; the supervisor infers 299. Not a resume past the fault."""
    paths = _run(tmp_path)
    for rank in (0, 1):
        for second in range(3):
            append_json_line(paths.heartbeat_file(0, rank), {"attempt": 0, "step": 100 * second, "time": 99.9 + second})
    append_json_line(paths.events_file(1), {"event": "checkpoint_loaded", "time": 110.0, "step": 299,
                                            "inferred": True, "source": "first step logged"})
    assert _verify(paths, _kill(), _recovery(resumed_from=299))[1] == []
    [finding] = _verify(paths, _kill(), _recovery(resumed_from=900))[1]
    assert finding["verdict"] == INEFFECTIVE


def test_a_kill_during_a_resumed_attempts_load_is_bounded_by_where_that_attempt_resumed(tmp_path: Path) -> None:
    """The rank API's resume phase beats step 0: a kill then saw no step; the next attempt resumes
    from the same checkpoint (200) its faulted attempt had resumed from."""
    paths = _run(tmp_path)
    for rank in (0, 1):
        append_json_line(paths.heartbeat_file(1, rank), {"attempt": 1, "step": 0, "time": 101.0, "phase": "resume",
                                                         "timeout_s": 300})
    fault = FaultRow(**{**asdict(_kill()), "attempt": 1})
    faulted_resumed = RecoveryRow(**{**asdict(_recovery(resumed_from=200)), "attempt": 1})
    following = RecoveryRow(**{**asdict(_recovery(resumed_from=200)), "attempt": 2})
    effects, findings = verify_run(RunEvidence(paths, 2, [fault], [faulted_resumed, following], _attempts()))
    assert findings == [], findings


def test_a_node_crash_is_allowed_the_time_its_command_took(tmp_path: Path) -> None:
    """The crash is stamped before scripts/cluster runs (it may wait on another run's restore for its
    lock): its record says how long the command took, and beats until then are the node's last."""
    paths = _run(tmp_path)
    _beats(paths, 0, 1, 100.0, KILL_AT + 3.0)
    slow = _kill(kind="node-crash", target="node n2", signal="")
    slow = FaultRow(**{**asdict(slow), "detail": "n2 crashed: link down (the command took 3.50 s); for the rest"})
    assert _verify(paths, slow)[1] == []
    quick = FaultRow(**{**asdict(slow), "detail": "n2 crashed: link down (the command took 0.10 s); for the rest"})
    [finding] = _verify(paths, quick)[1]
    assert "rank 1 trained on after the node-crash" in str(finding["what"])


def test_a_hang_checks_its_target_not_its_peers_on_the_node(tmp_path: Path) -> None:
    """hang-rank on rank 1: rank 0, on the same node, finishing its step after the SIGSTOP is no sign."""
    paths = _run(tmp_path, nodes=("n1", "n1"))
    _beats(paths, 0, 0, 100.0, KILL_AT + 0.5)
    _beats(paths, 0, 1, 100.0, KILL_AT - 0.01)
    hang = _kill(kind="hang-rank", signal="SIGSTOP", node="n1")
    effects, findings = _verify(paths, hang)
    assert findings == [] and effects[0].startswith("verified"), (effects, findings)


def test_a_rank_fault_on_several_nodes_checks_every_nodes_ranks(tmp_path: Path) -> None:
    """The agents' outcomes merged: "rank 0@n1; rank 1@n2". Rank 1 trained on: ineffective."""
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT - 0.01)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)
    both = FaultRow(**{**asdict(_kill(rank=0, node="n1,n2")), "target": "rank 0@n1; rank 1@n2"})
    [finding] = _verify(paths, both)[1]
    assert "rank 1 trained on" in str(finding["what"]), finding


def test_a_stall_in_a_run_that_pauses_for_checkpoints_is_held_to_its_training_pace(tmp_path: Path) -> None:
    """Review 35: the pace averaged over the attempt counted its 2 s checkpoints every 50 steps (of
    10 ms), and a rank rightly continued after its stall outran it."""
    paths = _run(tmp_path)
    moment, step = 100.0, 0
    while moment < KILL_AT - 0.01:  # 50 steps (0.5 s), then a checkpoint's 2 s, again
        for _ in range(10):
            append_json_line(paths.heartbeat_file(0, 1), {"attempt": 0, "step": step, "time": moment})
            moment, step = moment + 0.05, step + 5
        moment += 2.0
    stall = FaultRow(**{**asdict(_kill(kind="stall-rank", signal="SIGSTOP")), "at": moment,
                        "detail": "stopped for 3.00 s, then SIGCONT"})
    _beats(paths, 0, 1, moment + 3.05, moment + 5.0, first_step=step)  # continued at its training pace
    effects, findings = verify_run(RunEvidence(paths, 2, [stall], [], _attempts()))
    assert findings == [], findings


def test_a_kill_on_several_nodes_allows_each_node_the_spread_it_acted_within(tmp_path: Path) -> None:
    """Review 35: rank 1 reached the step 0.8 s after rank 0 and was killed then; the merged
    record's moment is the first node's, its detail says how far apart they acted."""
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT - 0.01)
    _beats(paths, 0, 1, 100.0, KILL_AT + 0.79)
    both = FaultRow(**{**asdict(_kill(rank=0, node="n1,n2")), "target": "rank 0@n1; rank 1@n2",
                       "detail": "2 nodes acted within 0.800 s"})
    assert _verify(paths, both)[1] == []


@pytest.mark.parametrize("detected_after_s,step,ineffective", [(8.3, 201, False), (20.0, 201, False),
                                                               (20.0, 203, True)])
def test_a_stopped_ranks_step_after_the_drill_ended_its_attempt_is_not_training_on(
        tmp_path: Path, detected_after_s: float, step: int, ineffective: bool) -> None:
    """The soak (seed 790151964): a hang-rank's SIGSTOPped rank, 8 s later taken for hung; the job's
    cancel sends SIGCONT before SIGTERM, and the rank finished the step it was in (517, beyond the
    beat before the fault, 514) and beat once as it died. What a rank does once the drill has ended
    its attempt is no sign that the fault missed it; nor is the step it was stopped in, finished
    (helper 37: a teardown that no error or detection came before, a peer's signalled death); two
    steps past the one it met, before the drill acted, is."""
    paths = _run(tmp_path)
    for rank in (0, 1):
        _beats(paths, 0, rank, 100.0, KILL_AT - 0.03)  # step 197 the last told: beats are rate-limited
    append_json_line(paths.heartbeat_file(0, 1), {"attempt": 0, "step": step, "time": KILL_AT + 8.58})
    hang = _kill(signal="SIGSTOP", kind="hang-rank")
    attempts = [AttemptRow("r000", 0, "1", "CANCELLED", 99.0, detected=KILL_AT + detected_after_s),
                AttemptRow("r000", 1, "2", "COMPLETED", 110.5)]
    effects, findings = verify_run(RunEvidence(paths, 2, [hang], [_recovery(resumed_from=150)], attempts))
    if ineffective:
        [finding] = findings
        assert "rank 1 trained on after the hang-rank (SIGSTOP): step 203 8.58 s after it" in finding.what, finding
    else:
        assert findings == [] and effects == ["verified: its target made no progress after it"], (effects, findings)


@pytest.mark.parametrize("peer_error_after_s,step,ineffective", [(7.0, 203, False), (None, 203, True)])
def test_a_stopped_ranks_step_after_its_peer_failed_is_not_training_on(
        tmp_path: Path, peer_error_after_s: float | None, step: int, ineffective: bool) -> None:
    """The soak again (TensorFlow, resubmit): rank 1 SIGSTOPped; 7 s later rank 0's collective timed
    out (its error recorded), the launch ended the step, whose teardown continued rank 1: it finished
    its step and beat once, before the controller detected anything. A SIGKILL's target is not given
    that allowance (test_a_kill_whose_target_trained_on_is_ineffective: its attempt failed at once)."""
    paths = _run(tmp_path)
    for rank in (0, 1):
        _beats(paths, 0, rank, 100.0, KILL_AT - 0.03)
    append_json_line(paths.heartbeat_file(0, 1), {"attempt": 0, "step": step, "time": KILL_AT + 7.32})
    if peer_error_after_s is not None:
        write_json_atomic(paths.rank_error_file(0, 0), {"rank": 0, "time": KILL_AT + peer_error_after_s,
                                                         "error": "DeadlineExceededError: Collective ops is aborted"})
    hang = _kill(signal="SIGSTOP", kind="hang-rank")
    attempts = [AttemptRow("r000", 0, "1", "FAILED", 99.0, detected=KILL_AT + 7.6, failed_at=KILL_AT + 7.5),
                AttemptRow("r000", 1, "2", "COMPLETED", 110.5)]
    _, findings = verify_run(RunEvidence(paths, 2, [hang], [_recovery(resumed_from=150)], attempts))
    assert [finding.verdict for finding in findings] == ([INEFFECTIVE] if ineffective else []), findings


def test_a_sigkilled_wrappers_trainer_that_trains_on_is_ineffective_though_the_attempt_failed_at_once(
        tmp_path: Path) -> None:
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT - 0.03)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)  # the trainer, outside the rank's tree, beats on
    attempts = [AttemptRow("r000", 0, "1", "FAILED", 99.0, detected=KILL_AT + 0.3, failed_at=KILL_AT + 0.05),
                AttemptRow("r000", 1, "2", "COMPLETED", 104.0)]
    _, findings = verify_run(RunEvidence(paths, 2, [_kill()], [_recovery(resumed_from=200)], attempts))
    assert [finding.verdict for finding in findings] == [INEFFECTIVE], findings


@pytest.mark.parametrize("evidence,failed_at", [("last_heartbeat", KILL_AT - 0.5), ("job_running", 100.0)])
def test_a_sigstop_that_missed_is_found_though_the_attempt_failed_as_hung_or_stuck(
        tmp_path: Path, evidence: str, failed_at: float) -> None:
    """Helper 37: a hang's failure is dated to its silent rank's last beat, a stuck start's to the
    job's start, both before the fault and before any teardown: they do not end the window."""
    paths = _run(tmp_path)
    _beats(paths, 0, 0, 100.0, KILL_AT - 0.5)  # rank 0 fell silent (the attempt's hang)
    _beats(paths, 0, 1, 100.0, KILL_AT + 1.0)  # rank 1 trained on after its SIGSTOP hit a wrapper
    attempts = [AttemptRow("r000", 0, "1", "CANCELLED", 99.0, detected=KILL_AT + 7.6, failed_at=failed_at,
                           failure_evidence=evidence),
                AttemptRow("r000", 1, "2", "COMPLETED", 110.5)]
    hang = _kill(signal="SIGSTOP", kind="hang-rank")
    _, findings = verify_run(RunEvidence(paths, 2, [hang], [_recovery(resumed_from=150)], attempts))
    assert [finding.verdict for finding in findings] == [INEFFECTIVE], findings
