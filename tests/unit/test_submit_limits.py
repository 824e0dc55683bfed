"""A site's limits at submission (real-sites issue, item 6): a limit of submitted jobs (Slurm's
MaxSubmitJobs of the user's association or QOS, the system's MaxJobCount) holds a run's submission
until the drill's other jobs end, without spending its submit_retries or looking the job up; a
refusal of the job as asked (a per-job QOS limit, an invalid account or QOS) fails the run at once,
saying the scheduler's words, instead of being tried and restarted until the budget is spent.
sbatch's stderr as Slurm 22.05 prints it (recorded)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import yaml

from experiments.layout import RankJob
from fake_scheduler import FakeScheduler
from orchestrator.backends.base import Submission, SubmitRefusal
from orchestrator.backends.slurm.backend import sbatch_refusal
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import load_campaign
from orchestrator.commands import CommandError
from orchestrator.control.controller import Controller
from orchestrator.control.submission import SUBMIT_FAILED
from orchestrator.control.tracker import RunTracker

pytestmark = pytest.mark.unit

SUBMIT_LIMIT = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates "
                "accounting/QOS policy (job submit limit, user's size and/or time limits)\n")
ASSOC_LIMIT = ("sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: Job violates "
               "accounting/QOS policy (job submit limit, user's size and/or time limits)\n")
WALL_LIMIT = ("sbatch: error: QOSMaxWallDurationPerJobLimit\nsbatch: error: Batch job submission failed: Job violates "
              "accounting/QOS policy (job submit limit, user's size and/or time limits)\n")
BAD_ACCOUNT = ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
               "specified\n")
NO_CONTROLLER = ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n")


def _error(stderr: str, command: str = "sbatch") -> CommandError:
    return CommandError([command, "--parsable", "x.sh"], 1, "", stderr, "command failed")


@pytest.mark.parametrize(("stderr", "held"), [(SUBMIT_LIMIT, True), (ASSOC_LIMIT, True), (WALL_LIMIT, False),
                                              (BAD_ACCOUNT, False)])
def test_sbatch_refusals_are_told_apart(stderr: str, held: bool) -> None:
    refusal = sbatch_refusal(_error(stderr))
    assert refusal is not None and refusal.held is held
    assert stderr.splitlines()[0].removeprefix("sbatch: error: ") in refusal.why


QUEUE_FULL = ("sbatch: error: Slurm job queue full, sleeping and retrying\nsbatch: error: Batch job submission failed: "
              "Unable to create job record, try again\n")
MUNGE_EAGAIN = ("sbatch: error: Munge encode failed: Failed to connect to \"/run/munge/munge.socket.2\": Resource "
                "temporarily unavailable\nsbatch: error: Batch job submission failed: Protocol authentication error\n")


def test_a_failure_to_reach_the_scheduler_is_no_refusal() -> None:
    assert sbatch_refusal(_error(NO_CONTROLLER)) is None
    assert sbatch_refusal(_error(SUBMIT_LIMIT, command="squeue")) is None
    assert sbatch_refusal(_error(MUNGE_EAGAIN)) is None, "an EAGAIN of the client's own spends submit retries"


def test_the_systems_job_count_limit_holds_and_a_timed_out_sbatch_is_looked_up() -> None:
    refusal = sbatch_refusal(_error(QUEUE_FULL))
    assert refusal is not None and refusal.held
    # sbatch killed at its timeout while retrying: it may have got the job in; looked up, not held
    timed_out = CommandError(["sbatch", "--parsable", "x.sh"], None, "",
                             "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying\n",
                             "command timed out after 60 s")
    assert sbatch_refusal(timed_out) is None


class SiteWithLimits(FakeScheduler):
    """Its first ``refusals`` submissions are answered with ``stderr``; then it takes them."""

    def __init__(self, stderr: str, refusals: int) -> None:
        super().__init__()
        self.stderr, self.refusals = stderr, refusals

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        if self.refusals:
            self.refusals -= 1
            self._called("submit", (run.run_id, job.attempt))
            raise _error(self.stderr)
        return super().submit(run, job)

    def submit_refusal(self, error: BaseException) -> SubmitRefusal | None:
        return sbatch_refusal(error)


def _spec(tmp_path: Path) -> Path:
    spec = {"name": "limits", "backend": "slurm", "workdir": str(tmp_path / "work"), "baseline": False,
            "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1},
            "restart": {"max_restarts": 3, "poll_interval_s": 0.01, "submit_retries": 1, "submit_backoff_s": 0.0}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _rounds(controller: Controller, rounds: int) -> None:
    seen = []
    controller.run(observer=lambda trackers, touched: seen.append(1) or (len(seen) >= rounds and controller.stop_requested.set()))


def test_a_submission_held_by_the_sites_submit_limit_waits_and_spends_no_retry(tmp_path: Path) -> None:
    site = SiteWithLimits(SUBMIT_LIMIT, refusals=5)  # more refusals than submit_retries (1) allows failures
    controller = Controller(load_campaign(_spec(tmp_path)), backend=site)
    try:
        _rounds(controller, 5)
        [run] = controller.runs
        [row] = controller.ledger.attempts(run.run_id)
        assert row.state != SUBMIT_FAILED and not row.reason, row
        assert site.called("find_submitted") == [], "a held submission reached nothing: it is not looked up"
        assert len(site.called("submit")) == 1, "tried again later (every 10 s), not each round"
    finally:
        controller.close()


def test_a_job_the_site_refuses_as_asked_fails_the_run_at_once_with_its_words(tmp_path: Path) -> None:
    site = SiteWithLimits(WALL_LIMIT, refusals=10)
    controller = Controller(load_campaign(_spec(tmp_path)), backend=site)
    try:
        _rounds(controller, 5)
        [run] = controller.runs
        rows = controller.ledger.attempts(run.run_id)
        assert [row.state for row in rows] == [SUBMIT_FAILED], "no second try, no restart: none can be taken"
        assert "QOSMaxWallDurationPerJobLimit" in (rows[0].reason or ""), rows[0]
        assert controller.ledger.run(run.run_id).status in ("gave_up", "failed")
        assert len(site.called("submit")) == 1
    finally:
        controller.close()


def test_a_limit_that_never_clears_fails_the_run_after_submit_hold_s(tmp_path: Path) -> None:
    site = SiteWithLimits(SUBMIT_LIMIT, refusals=10**6)
    path = _spec(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["restart"]["submit_hold_s"] = 0.05
    path.write_text(yaml.safe_dump(spec))
    controller = Controller(load_campaign(path), backend=site)
    try:
        controller.run(observer=lambda trackers, touched: None)  # to the end: the run fails
        [run] = controller.runs
        [row] = controller.ledger.attempts(run.run_id)  # no restart: a new attempt would be held as long
        assert row.state == SUBMIT_FAILED and "held by the site's limit of submitted jobs" in (row.reason or ""), row
    finally:
        controller.close()


def test_a_held_submission_is_tried_again_as_soon_as_a_job_of_the_drill_ends(tmp_path: Path) -> None:
    """Review of item 6: at the site's limit, a run's resubmission can be refused while its failed
    job is still finishing; it is tried again once the scheduler shows a job of the drill ended
    (the next poll), not at its next regular try 10 s later."""
    from orchestrator.states import JobState

    site = SiteWithLimits(SUBMIT_LIMIT, refusals=1)
    controller = Controller(load_campaign(_spec(tmp_path)), backend=site)
    tries = []

    def a_job_ends(trackers: list, touched: list) -> None:
        tries.append(len(site.called("submit")))
        if len(tries) == 2:
            site.states["outside-999"] = JobState.COMPLETED  # one of the drill's jobs ended (polled next round)
        if len(tries) >= 5:
            controller.stop_requested.set()

    site.watched_extra = ["outside-999"]
    try:
        with patch.object(RunTracker, "watched_job_ids", lambda self: list(site.watched_extra)):
            controller.run(observer=a_job_ends)
    finally:
        controller.close()
    assert tries[0] == 1 and tries[-1] == 2, f"held once, then tried again at once after the end: {tries}"


NODES_UNAVAILABLE = ("sbatch: error: Batch job submission failed: Requested node configuration is not available\n")
NODE_GONE = "sbatch: error: Batch job submission failed: Invalid node name specified\n"  # a cloud node removed


@pytest.mark.parametrize("refused", [NODES_UNAVAILABLE, NODE_GONE])
def test_a_refusal_while_the_attempt_stays_off_failed_nodes_is_tried_again_without_leaving_them_out(
        tmp_path: Path, refused: str) -> None:
    """Review of issue 22: after a node failure with exclude_node, on a partition of exactly the job's
    nodes, the drill's own --exclude made the job impossible: the run ended at once 'refused as
    asked'. The same attempt goes out again without the exclusion; a second refusal is for good."""
    from orchestrator.campaign.runs import expand_runs
    from orchestrator.control.submission import SubmissionHooks, Submitter
    from orchestrator.record.ledger import Ledger

    asked: list[tuple[str, ...]] = []

    def submit(run: RunConfig, job: RankJob) -> Submission:
        asked.append(job.exclude_nodes)
        if job.exclude_nodes:
            raise _error(refused)
        return Submission("77", 1.0)

    backend = SimpleNamespace(submit=submit, submit_refusal=sbatch_refusal)
    [run] = expand_runs(load_campaign(_spec(tmp_path)))
    ledger = Ledger.in_workdir(tmp_path / "work")
    ledger.add_attempt(run.run_id, 1, excluded_nodes=("fd-n2",))
    accepted: list[tuple[int, str]] = []
    hooks = SubmissionHooks(accepted=lambda attempt, submission, *, fence=True: accepted.append((attempt, submission.job_id)),
                            gave_up=lambda attempt, now: pytest.fail("gave up"),
                            refused=lambda why, now: pytest.fail(f"refused: {why}"),
                            cancel=lambda job_id: pytest.fail("cancelled"))
    restart = load_campaign(_spec(tmp_path)).restart
    submitter = Submitter(run, backend, ledger, "d1", restart, hooks)  # type: ignore[arg-type]  # the two calls used
    job = RankJob(run_id=run.run_id, run_dir=str(run.paths.root), attempt=1, workload=run.workload,
                  checkpoint_every=5, checkpoint_keep=2, exclude_nodes=("fd-n2",))
    submitter.submit(1, job, now=10.0)
    submitter.try_pending(10.0)  # the controller's next round
    assert asked == [("fd-n2",), ()] and accepted == [(1, "77")], (asked, accepted)
    assert ledger.attempts(run.run_id)[0].excluded_nodes is None, "the ledger says it was not left out"
    ledger.close()
