"""The controller's submissions against a scheduler that records every call (tests/unit/fake_scheduler.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fake_scheduler import FakeScheduler
from orchestrator.campaign.spec import Campaign, load_campaign
from orchestrator.control.controller import Controller, array_throttles

pytestmark = pytest.mark.unit


def _sweep(tmp_path: Path, runs: int, parallel_runs: int) -> Path:
    spec = {
        "name": "array-sweep", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 100, "seed": 1, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "restart": {"max_restarts": 1, "poll_interval_s": 0.01},
        "parallel_runs": parallel_runs, "submit_as_array": True,
        "sweep": {"grid": {"workload.seed": list(range(runs))}},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _first_round(controller: Controller) -> None:
    """The controller's loop, stopped after its first round."""
    controller.run(observer=lambda trackers, touched: controller.stop_requested.set())


def _a_controller_leaves_its_jobs_running(spec: Campaign, scheduler: FakeScheduler) -> None:
    """One controller's first round on ``spec``; then every job it left is RUNNING."""
    from orchestrator.states import JobState

    controller = Controller(spec, backend=scheduler)
    try:
        _first_round(controller)
    finally:
        controller.close()
    scheduler.states.update(dict.fromkeys(scheduler.states, JobState.RUNNING))


def test_a_refused_array_does_not_flood_the_scheduler_past_parallel_runs(tmp_path: Path) -> None:
    """Issue 21, item 4: the array of 8 runs is refused; its runs are looked up and submitted one
    by one, parallel_runs (2) at a time, not all 8 in one round."""
    scheduler = FakeScheduler(refuse={"submit_array"})
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=2)), backend=scheduler)
    try:
        _first_round(controller)
    finally:
        controller.close()
    assert len(scheduler.called("submit_array")) == 1
    assert len(scheduler.called("submit")) == 2, scheduler.calls


def test_an_array_larger_than_the_sites_max_array_size_goes_out_in_parts(tmp_path: Path) -> None:
    """Issue 21, item 4: MaxArraySize 3 and 8 runs, 5 at once: arrays of 3, 3 and 2, every run in
    one, their throttles together 5 (each part its own throttle: parallel_runs each ran 15)."""
    scheduler = FakeScheduler(max_array=3)
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=5)), backend=scheduler)
    try:
        _first_round(controller)
    finally:
        controller.close()
    arrays = scheduler.called("submit_array")
    assert [len(array) for array in arrays] == [3, 3, 2], arrays
    assert sorted(run for array in arrays for run in array) == sorted(run.run_id for run in controller.runs)
    assert scheduler.throttles == [2, 2, 1] and not scheduler.called("submit")


def test_under_the_sites_limit_of_submitted_jobs_arrays_and_runs_in_flight_keep_to_it(tmp_path: Path) -> None:
    """Issue 22, item 6 (MaxSubmitJobs 3, parallel_runs 5, 8 runs): every element of an array counts
    toward the limit, pending or not, so the arrays hold 3 runs in all (not 8 throttled to 5, which
    Slurm refuses whole); as runs end, the next ones go out, never more than 3 in flight; the
    report's site note says why fewer than parallel_runs ran."""
    from orchestrator.states import JobState

    scheduler = FakeScheduler(max_array=2, max_submit=3)
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=5)), backend=scheduler)
    most_in_flight = []

    def runs_end_one_by_one(trackers: list, touched: list) -> None:
        in_flight = [job for job, state in scheduler.states.items() if not state.is_terminal]
        most_in_flight.append(len(in_flight))
        if in_flight:
            scheduler.states[in_flight[0]] = JobState.CANCELLED  # the job ends (a person's cancel: the run gives up)
        if len(scheduler.states) == 8 and not in_flight:
            controller.stop_requested.set()

    try:
        controller.run(observer=runs_end_one_by_one)
        notes = controller.ledger.meta("site_notes")
    finally:
        controller.close()
    arrays = scheduler.called("submit_array")
    assert [len(array) for array in arrays] == [2, 1] and scheduler.throttles == [2, 1], arrays
    assert len(scheduler.called("submit")) == 5, "the other five went out on their own, as runs ended"
    assert max(most_in_flight) == 3, most_in_flight
    assert notes and "MaxSubmitJobs: 3)" in notes[0] and "parallel_runs 5" in notes[0], notes


def test_a_limit_far_above_parallel_runs_keeps_the_sweep_one_array(tmp_path: Path) -> None:
    """Review of item 6: a site's limit of 100 submitted jobs binds nothing for 8 runs 2 at a time:
    one array of 8 throttled to 2, as without a limit (not an array of 2 and six single jobs)."""
    scheduler = FakeScheduler(max_submit=100)
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=2)), backend=scheduler)
    try:
        _first_round(controller)
        notes = controller.ledger.meta("site_notes")
    finally:
        controller.close()
    assert [len(array) for array in scheduler.called("submit_array")] == [8] and scheduler.throttles == [2]
    assert not notes, "a limit that does not bind is no site note"


def test_a_limit_of_no_jobs_is_refused_before_anything_goes_out(tmp_path: Path) -> None:
    from orchestrator.campaign.spec import SpecError

    scheduler = FakeScheduler(max_submit=0)
    with pytest.raises(SpecError, match=r"allows you no submitted jobs \(the test's MaxSubmitJobs is 0\)"):
        Controller(load_campaign(_sweep(tmp_path, runs=2, parallel_runs=2)), backend=scheduler)
    assert not scheduler.called("submit_array") and not scheduler.called("submit")


def test_a_restarted_controller_under_a_lower_limit_still_watches_every_run_in_flight(tmp_path: Path) -> None:
    """Review of item 6: six runs left in flight (an array of 6, four running) by a controller that
    read no limit; the next one reads a limit of 2 (an admin's change, a sacctmgr that answered
    this time). Every job in flight is watched at once; the limit holds back only new submissions."""

    spec = load_campaign(_sweep(tmp_path, runs=6, parallel_runs=4))
    scheduler = FakeScheduler()
    _a_controller_leaves_its_jobs_running(spec, scheduler)
    scheduler.max_submit, scheduler.calls = 2, []
    controller = Controller(spec, backend=scheduler)
    try:
        _first_round(controller)
    finally:
        controller.close()
    polled = {job for jobs in scheduler.called("poll") for job in jobs}
    assert polled == {f"101_{index}" for index in range(6)}, polled
    assert not scheduler.called("submit") and not scheduler.called("submit_array"), "nothing sent again"


@pytest.mark.parametrize("sizes,parallel_runs,throttles", [
    ([8], 2, [2]), ([3, 3, 2], 5, [2, 2, 1]), ([3, 3, 2], 2, [1, 1, 0]), ([2, 1], 64, [2, 1]), ([1001] * 3, 64, [22, 21, 21]),
])
def test_parallel_runs_is_shared_out_among_the_arrays(sizes, parallel_runs, throttles) -> None:
    assert array_throttles(sizes, parallel_runs) == throttles


def test_an_attempt_in_the_same_job_is_looked_up_as_its_array_element(tmp_path: Path) -> None:
    """Issue 21, item 3: in-allocation relaunches attempt 1 in the job attempt 0 went out in, an
    element of an array: recorded as that element (its index), so that a restarted controller's
    lookup finds that element, not every element of the array (other runs' jobs)."""
    from fake_scheduler import launch_exited
    from orchestrator.states import JobState

    data = yaml.safe_load(_sweep(tmp_path, runs=2, parallel_runs=2).read_text())
    data["restart"].update(strategy="in-allocation", max_restarts=2)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(path), backend=scheduler)
    second = controller.runs[1]

    def second_runs_ranks_die(trackers: list, touched: list) -> None:
        element = "101_1"
        if scheduler.states.get(element) is JobState.PENDING:
            scheduler.states = {job: JobState.RUNNING for job in scheduler.states}
            launch_exited(second.paths.root, 0, 137)
        elif len(controller.ledger.attempts(second.run_id)) == 2:
            controller.stop_requested.set()

    try:
        controller.run(observer=second_runs_ranks_die)
        first, relaunched = controller.ledger.attempts(second.run_id)
    finally:
        controller.close()
    assert (first.job_id, first.array_index) == ("101_1", 1)
    assert relaunched.job_name == first.job_name and relaunched.array_index == 1, relaunched


def test_every_run_has_injector_threads_of_its_own(tmp_path: Path) -> None:
    """Issue 21, item 8: one 4-thread pool served every run, so a fifth run's fault waited behind
    four long ones (a node crash's hold, a stall, a disk-full) and acted seconds late. Each run's
    faults now go to a pool of its own: eight runs, eight pools."""
    controller = Controller(load_campaign(_sweep(tmp_path, runs=8, parallel_runs=8)), backend=FakeScheduler())
    try:
        pools = controller.injector_pools()
        trackers = controller.trackers(pools)
        assert len({id(tracker.faults.pool) for tracker in trackers}) == 8
    finally:
        for pool in pools.values():
            pool.shutdown()
        controller.close()


def test_a_relaunch_in_a_later_job_is_looked_up_under_that_jobs_name(tmp_path: Path) -> None:
    """Review of item 3: attempt 0's job ended (a new job for attempt 1), then attempt 1's ranks die
    in that job and attempt 2 relaunches there: attempt 2 is that job's, recorded under its name."""
    from fake_scheduler import launch_exited
    from orchestrator.states import JobState

    data = yaml.safe_load(_sweep(tmp_path, runs=1, parallel_runs=1).read_text())
    data["restart"].update(strategy="in-allocation", max_restarts=3)
    data["submit_as_array"] = False
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(path), backend=scheduler)
    [run] = controller.runs

    def two_failures(trackers: list, touched: list) -> None:
        attempts = controller.ledger.attempts(run.run_id)
        job = attempts[-1].job_id
        if job is None or len(attempts) > 2:
            controller.stop_requested.set()
        elif scheduler.states[job] is JobState.PENDING:
            scheduler.states[job] = JobState.RUNNING
            launch_exited(run.paths.root, len(attempts) - 1, 137)
            if len(attempts) == 1:
                scheduler.states[job] = JobState.FAILED  # the first job ends with its ranks

    try:
        controller.run(observer=two_failures)
        attempts = controller.ledger.attempts(run.run_id)
    finally:
        controller.close()
    first, second, relaunched = attempts
    assert first.job_id != second.job_id == relaunched.job_id, attempts
    assert relaunched.job_name == second.job_name != first.job_name, attempts


def test_the_report_counts_the_connections_a_warm_coordinator_refused(tmp_path: Path) -> None:
    """Security issue 28, item 1: refusals are events of the attempt, and the run's row counts them."""
    from experiments.layout import EVENT_WARM_REFUSED, append_json_line
    from orchestrator.report.document import build_report

    data = yaml.safe_load(_sweep(tmp_path, runs=1, parallel_runs=1).read_text())
    data["restart"].update(strategy="warm", warm_spares=1)
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(data))
    scheduler = FakeScheduler()
    controller = Controller(load_campaign(path), backend=scheduler)
    try:
        _first_round(controller)
        run = controller.runs[0]
        for slot in (7, -1):
            append_json_line(run.paths.events_file(0), {"event": EVENT_WARM_REFUSED, "time": 1.0, "slot": slot,
                                                        "why": "its hello does not prove the job's secret"})
    finally:
        controller.close()
    [row] = build_report(controller.campaign.workdir)["runs"]
    assert row["warm_refused"] == 2


def test_a_restarted_controller_counts_the_arrays_in_flight_against_parallel_runs(tmp_path: Path) -> None:
    """Review of item 4: 8 runs in arrays of 2 with parallel_runs 2 go out as throttles 1 and 1, two
    arrays waiting; a controller started again gave the waiting ones the whole parallel_runs."""

    spec = load_campaign(_sweep(tmp_path, runs=8, parallel_runs=2))
    scheduler = FakeScheduler(max_array=2)
    for _ in range(2):
        _a_controller_leaves_its_jobs_running(spec, scheduler)
    assert scheduler.throttles == [1, 1], scheduler.throttles


def test_a_rounds_work_follows_the_runs_in_flight_not_the_sweeps_size(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a run that waits for its turn or has ended costs a round nothing. 30 runs, 2 in
    flight, each ended by the scheduler as it runs: every round (the first, which looks at every
    run once, aside) asks only the runs in flight and those it ended for their jobs, and its
    observers are told of those alone. Counts calls, not time."""
    from orchestrator.control.tracker import RunTracker
    from orchestrator.states import JobState

    asked: list[str] = []
    watched = RunTracker.watched_job_ids
    monkeypatch.setattr(RunTracker, "watched_job_ids", lambda self: asked.append(self.run.run_id) or watched(self))
    spec = load_campaign(_sweep(tmp_path, runs=30, parallel_runs=2))
    spec = spec.model_copy(update={"submit_as_array": False})
    scheduler = FakeScheduler()
    controller = Controller(spec, backend=scheduler)
    rounds: list[tuple[int, int, int]] = []  # (runs asked, runs told to the observers, every run)

    def runs_end_as_they_run(trackers: list, touched: list) -> None:
        rounds.append((len(set(asked)), len(touched), len(trackers)))
        asked.clear()
        running = [job for job, state in scheduler.states.items() if not state.is_terminal]
        for job in running:
            scheduler.states[job] = JobState.CANCELLED  # a person's cancel: the run gives up
        if len(scheduler.states) == 30 and not running:
            controller.stop_requested.set()

    try:
        controller.run(observer=runs_end_as_they_run)
    finally:
        controller.close()
    assert len(scheduler.called("submit")) == 30
    assert rounds[0][1] == 30, "the first round's observers see every run once"
    later = rounds[1:]
    assert len(later) >= 15 and all(told <= 2 * 2 and runs_asked <= 2 * 2 for runs_asked, told, _ in later), later
    assert all(every == 30 for _, _, every in rounds)


def test_an_arrays_pending_elements_cost_a_round_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a sweep that goes out as job arrays has every run's job out at once, most of them
    pending. 30 runs in three arrays of 10, 3 at once: the scheduler starts them two at a time from
    the last element backwards (out of the arrays' order) and each ends as it runs. A round reads
    the files of the runs in flight and those it ended, never all 30 (a pending array's first
    element costs one look at its directory); every run is still taken back when the scheduler
    starts it (its poll), and ends. Counts calls, not time."""
    from orchestrator.control.progress import RowBook
    from orchestrator.control.story import Story
    from orchestrator.observe.watch import AttemptWatch
    from orchestrator.states import JobState

    read: list[str] = []
    reading = AttemptWatch.read
    monkeypatch.setattr(AttemptWatch, "read", lambda self, now=None: read.append(self.job_id) or reading(self, now))
    scheduler = FakeScheduler(max_array=10)
    controller = Controller(load_campaign(_sweep(tmp_path, runs=30, parallel_runs=3)), backend=scheduler)
    story = Story()
    book = RowBook(story)  # the live display's and progress.json's rows
    rounds: list[tuple[int, int, int]] = []  # (runs whose files were read, runs told to the observers, rows built)

    def scheduler_runs_two_backwards(trackers: list, touched: list) -> None:
        story.new_lines(touched, now=len(rounds))  # a look every round
        rounds.append((len(set(read)), len(touched), len(book.update(trackers, touched))))
        read.clear()
        # The scheduler moves on once the controller heard it (its poll answers on a thread of its
        # own: on a loaded host an answer can come a few rounds late, and the starts and ends of
        # those rounds would come in one answer).
        heard_running = {tracker.watch.job_id for tracker in trackers
                         if tracker.watch is not None and tracker.watch.state is JobState.RUNNING}
        for job, state in scheduler.states.items():
            if state is JobState.RUNNING and job in heard_running:
                scheduler.states[job] = JobState.CANCELLED  # a person's cancel: the run gives up
        if JobState.RUNNING not in scheduler.states.values():
            pending = [job for job, state in scheduler.states.items() if state is JobState.PENDING]
            for job in pending[::-1][:2]:
                scheduler.states[job] = JobState.RUNNING
        if all(tracker.done for tracker in trackers):
            controller.stop_requested.set()

    try:
        controller.run(observer=scheduler_runs_two_backwards)
        for look in range(2):  # the last runs' ends told, then read once more
            story.new_lines([], now=len(rounds) + 1 + look)
    finally:
        controller.close()
    assert [len(array) for array in scheduler.called("submit_array")] == [10, 10, 10]
    assert all(tracker.done for tracker in controller._trackers), "every run was taken back when it started"
    assert rounds[0] == (0, 30, 30), "the first round tells and shows every run once, reads none still pending"
    later = rounds[1:]
    bound = 2 * 2  # started, ending (each array's first pending element: one look at its directory)
    assert len(later) >= 15 and all(runs_read <= bound and told <= bound for runs_read, told, _ in later), later
    # rows built: the two started, the two ended this round and the two the round before (read once more)
    assert all(built <= 3 * 2 for _, _, built in later), ("a pending element's row stands until it starts", later)
    assert sum(built for _, _, built in later) >= 30, "every run's row is built again as it runs and ends"
    assert set(story.settled) == {tracker.run.run_id for tracker in controller._trackers}, "every story told to its end"


def test_a_run_with_a_job_in_flight_and_a_failed_one_closing_is_counted_once_under_a_sites_limit(
        tmp_path: Path) -> None:
    """Review of issue 29: a run whose new attempt runs while its failed job is still closing is in
    flight and closing at once; its jobs were counted twice under MaxSubmitJobs and a waiting run was
    held back. Limit 4, 2 in flight: r000 fails (its job stays COMPLETING) and goes out again,
    r001 completes: 2 jobs held, so r002 goes out."""
    from fake_scheduler import launch_exited, run_completed
    from orchestrator.states import JobState

    spec = load_campaign(_sweep(tmp_path, runs=3, parallel_runs=2)).model_copy(update={"submit_as_array": False})
    scheduler = FakeScheduler(max_submit=4)
    controller = Controller(spec, backend=scheduler)
    first, second, third = controller.runs
    stage, rounds_after = [0], [0]

    def r000_fails_r001_completes(trackers: list, touched: list) -> None:
        states = scheduler.states
        if stage[0] == 0 and states.get("101") is JobState.PENDING:
            states["101"] = JobState.RUNNING
            launch_exited(first.paths.root, 0, 137)
            stage[0] = 1
        if stage[0] >= 1 and "101" in states:
            states["101"] = JobState.COMPLETING  # the failed job takes its time to end
        if stage[0] == 1 and len(controller.ledger.attempts(first.run_id)) == 2 and trackers[0].job_id:
            states["102"] = JobState.COMPLETED
            run_completed(second.paths.root, 0, 100)
            stage[0] = 2
        if stage[0] == 2 and (controller.ledger.attempts(third.run_id) or rounds_after[0] >= 40):
            controller.stop_requested.set()
        rounds_after[0] += stage[0] == 2

    try:
        controller.run(observer=r000_fails_r001_completes)
        third_attempts = controller.ledger.attempts(third.run_id)
    finally:
        controller.close()
    assert stage[0] == 2 and third_attempts, f"r002 held back: {scheduler.calls}"


def test_a_sweeps_runs_are_registered_in_one_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a commit each (synchronous=FULL: an fsync each) made registering 10,000 runs seconds
    of the drill's set-up; every run is added inside one transaction."""
    from orchestrator.record.ledger import Ledger

    depths: list[int] = []
    add_run = Ledger.add_run
    monkeypatch.setattr(Ledger, "add_run", lambda self, row: depths.append(self._depth) or add_run(self, row))
    controller = Controller(load_campaign(_sweep(tmp_path, runs=30, parallel_runs=2)), backend=FakeScheduler())
    try:
        assert len(controller.ledger.runs()) == 30
    finally:
        controller.close()
    assert len(depths) == 30 and all(depth >= 1 for depth in depths), depths
