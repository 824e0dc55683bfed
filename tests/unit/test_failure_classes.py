"""The failure-class table (issue 9) on recorded evidence: every class, and the order that makes a
cause win over its consequences (a survivor's "peer closed" is not why a run failed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.campaign.failure_classes import Classified, DrillEnded, FailureClass, FailureEvidence, classify
from orchestrator.observe.failure_signs import facts_from_json, facts_json
from orchestrator.states import JobState

C = FailureClass
GLOO_PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
             "[10.213.77.12]:23851")
ENOSPC = ("OSError: [Errno 28] checkpoint step 2000 could not be written: no space left on device (0.5 MB free on "
          "/w/runs/r005/checkpoints); RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos")


@pytest.mark.parametrize("evidence,expected,says", [
    (FailureEvidence(JobState.RUNNING, "last_heartbeat", lost_nodes=("fd-n2",)), C.NODE_FAIL,
     "node fd-n2 lost (the injector's record)"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=1, rank_errors=(GLOO_PEER,), lost_nodes=("fd-n3",)),
     C.NODE_FAIL, "node fd-n3 lost"),
    (FailureEvidence(JobState.RUNNING, "last_heartbeat"), C.HANG, "silent"),
    (FailureEvidence(JobState.RUNNING, "job_running"), C.START_TIMEOUT, "no training step"),
    (FailureEvidence(JobState.NODE_FAIL, "scheduler_end", exit_code=1), C.NODE_FAIL, "NODE_FAIL"),
    (FailureEvidence(JobState.TIMEOUT, "scheduler_end", warned=True), C.TIMEOUT, "walltime"),
    (FailureEvidence(JobState.PREEMPTED, "scheduler_end"), C.PREEMPTED, "PREEMPTED"),
    (FailureEvidence(JobState.CANCELLED, "scheduler_end", warned=True), C.PREEMPTED, "warning, then cancelled"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=143, warned=True), C.PREEMPTED, "warning"),
    # The launch exited at the walltime before the scheduler said TIMEOUT (PBS under load): a walltime.
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=143, warned=True, walltime_reached=True), C.TIMEOUT,
     "walltime"),
    (FailureEvidence(JobState.FAILED, "poll", exit_code=137, warned=True), C.PREEMPTED, "warning, then failed"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=1, rank_errors=(ENOSPC,), warned=True),
     C.CHECKPOINT_WRITE_FAILED, "no space"),
    (FailureEvidence(JobState.OUT_OF_MEMORY, "scheduler_end"), C.OUT_OF_MEMORY, "OUT_OF_MEMORY"),
    # An OOM kill is a SIGKILL (exit 137) with a survivor's "peer closed": the agent's count decides.
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=137, rank_errors=(GLOO_PEER,),
                     oom_killed=("rank 1@fd-n2",)), C.OUT_OF_MEMORY, "OOM killer ended rank 1@fd-n2"),
    (FailureEvidence(JobState.FAILED, "step_exit", exit_code=1, rank_errors=("MemoryError: ",)), C.OUT_OF_MEMORY,
     "MemoryError"),
    (FailureEvidence(JobState.CANCELLED, "scheduler_end"), C.CANCELLED, "outside the drill"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=143, rank_errors=(ENOSPC, GLOO_PEER)),
     C.CHECKPOINT_WRITE_FAILED, "no space left on device"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=3, rank_errors=("ValueError: bad batch",)),
     C.RANK_EXIT, "a rank raised: ValueError: bad batch"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=2), C.RANK_EXIT, "exit code 2"),
    (FailureEvidence(JobState.RUNNING, "step_exit", exit_code=137, rank_errors=(GLOO_PEER,)), C.RANK_SIGNAL,
     "SIGKILL (exit code 137)"),
    (FailureEvidence(JobState.FAILED, "poll", rank_errors=(GLOO_PEER,)), C.RANK_SIGNAL, "died without a word"),
    (FailureEvidence(JobState.FAILED, "poll", exit_code=-15), C.RANK_SIGNAL, "SIGTERM"),
    # A warm job on Slurm: its coordinator saw a rank's connection end, not how the process ended.
    (FailureEvidence(JobState.RUNNING, "warm", signalled="SIGKILL"), C.RANK_SIGNAL, "SIGKILL (the injector's record)"),
    (FailureEvidence(JobState.RUNNING, "warm", exit_code=137, signalled="SIGTERM"), C.RANK_SIGNAL, "SIGKILL (exit code 137)"),
    # Open MPI 5 under srun --mpi=pmix: a survivor learns of its peer's death at once and aborts
    # (exit code 14) before the launch sees the killed rank's end; the injector's record is the cause.
    (FailureEvidence(JobState.FAILED, "poll", exit_code=14, signalled="SIGKILL"), C.RANK_SIGNAL,
     "SIGKILL (the injector's record; the launch then exited with code 14"),
    # ... but a signal that ends nothing (SIGCONT) leaves a rank's own exit code its own.
    (FailureEvidence(JobState.FAILED, "poll", exit_code=2, signalled="SIGCONT"), C.RANK_EXIT, "exit code 2"),
    (FailureEvidence(JobState.FAILED, "poll", exit_code=2, signalled="SIGUSR1"), C.RANK_SIGNAL, "SIGUSR1"),
    # A warm job (no exit code): a continue is no cause of a death either.
    (FailureEvidence(JobState.RUNNING, "warm", signalled="SIGCONT"), C.UNKNOWN, "noticed by warm"),
    (FailureEvidence(JobState.FAILED, "poll"), C.UNKNOWN, "scheduler state FAILED"),
    (FailureEvidence(JobState.UNKNOWN, "poll"), C.UNKNOWN, "noticed by poll"),
])
def test_every_class_from_recorded_evidence(evidence: FailureEvidence, expected: FailureClass, says: str) -> None:
    found = classify(evidence)
    assert found.failure_class is expected
    assert says in found.evidence, found.evidence


def test_a_hang_the_controller_cancelled_stays_a_hang() -> None:
    # The controller cancels a hung job, so the scheduler later says CANCELLED: silence came first.
    assert classify(FailureEvidence(JobState.CANCELLED, "last_heartbeat")).failure_class is C.HANG


def test_the_attempts_reason_names_the_cause_not_a_survivors_word(tmp_path) -> None:  # noqa: ANN001
    import json

    from experiments.layout import RunPaths
    from orchestrator.observe.watch import AttemptWatch, rank_error_suffix

    paths = RunPaths(tmp_path)
    watch = AttemptWatch(attempt=0, job_id="7", paths=paths, ranks=2)

    def died(rank: int, at: float, error: str) -> None:
        paths.rank_error_file(0, rank).parent.mkdir(parents=True, exist_ok=True)
        paths.rank_error_file(0, rank).write_text(json.dumps({"rank": rank, "time": at, "error": error}))

    assert rank_error_suffix(watch) == ""
    died(0, 1.0, GLOO_PEER)
    assert rank_error_suffix(watch) == f"; rank 0 lost a peer: {GLOO_PEER}"
    died(1, 2.0, "ValueError: bad batch")  # later, but the cause
    assert rank_error_suffix(watch) == "; rank 1: ValueError: bad batch"


def test_a_job_the_scheduler_requeued_was_preempted() -> None:
    assert classify(FailureEvidence(JobState.PENDING, "requeued")).failure_class is C.PREEMPTED
    assert classify(FailureEvidence(JobState.REQUEUED, "poll")).failure_class is C.PREEMPTED


def test_the_facts_kept_in_the_ledger_give_the_same_class_and_the_final_state_can_refine_it() -> None:
    """A class taken while the job still ran is taken again with the scheduler's final word, from
    the facts kept with the attempt (a controller started later has only those)."""
    taken = FailureEvidence(JobState.RUNNING, "step_exit", exit_code=143, rank_errors=(GLOO_PEER,),
                            lost_nodes=("fd-n2",))
    kept = facts_from_json(facts_json(taken))
    assert kept == taken and classify(kept) == classify(taken)
    warned = FailureEvidence(JobState.RUNNING, "step_exit", exit_code=143, warned=True)
    assert classify(warned).failure_class is C.PREEMPTED
    final = replace(facts_from_json(facts_json(warned)), state=JobState.TIMEOUT)
    assert classify(final).failure_class is C.TIMEOUT


def test_facts_kept_before_the_oom_record_existed_still_read() -> None:
    """Ledgers written before ``oom_killed`` was a fact: the field is absent, and reads as none."""
    old = facts_json(FailureEvidence(JobState.FAILED, "step_exit", exit_code=137)).replace(', "oom_killed": []', "")
    assert "oom_killed" not in old
    assert facts_from_json(old).oom_killed == ()
    assert classify(facts_from_json(old)).failure_class is C.RANK_SIGNAL


def test_a_job_the_drill_cancelled_itself_is_not_a_persons_cancel() -> None:
    """in-allocation: the drill could not end a hung launch and cancelled the allocation the next
    attempt was to run in; that attempt's end has the hang's class, and the facts keep it."""
    ended = DrillEnded("HANG", "attempt 1's hung launch could not be ended alone")
    taken = FailureEvidence(JobState.CANCELLED, "scheduler_end", ended_by_drill=ended)
    assert classify(taken) == Classified(C.HANG, "the drill ended the job: attempt 1's hung launch could not be "
                                                 "ended alone")
    assert facts_from_json(facts_json(taken)) == taken
    assert classify(replace(taken, ended_by_drill=None)).failure_class is C.CANCELLED


def test_a_launch_that_exits_at_its_walltime_reached_it_on_the_jobs_clock() -> None:
    from orchestrator.observe.failure_signs import walltime_reached
    from orchestrator.observe.watch import AttemptWatch, FailureSign

    watch = AttemptWatch.__new__(AttemptWatch)  # only the job's start is read
    watch.job_started = 1000.0
    at_limit, early = FailureSign("rank launch exited", 1058.0, "step_exit"), FailureSign("x", 1030.0, "step_exit")
    assert walltime_reached(watch, at_limit, time_limit_s=60)  # within the slack of the limit
    assert not walltime_reached(watch, early, time_limit_s=60), "a preemption half way is no walltime"
    login_clock = FailureSign("job failed", 1070.0, "poll")
    assert not walltime_reached(watch, login_clock, time_limit_s=60), "only the job's own clock is set against it"
    watch.job_started = None
    assert not walltime_reached(watch, at_limit, time_limit_s=60)
