"""The restart controller: runs a campaign to the end, one batched scheduler poll per interval.

Every decision is written to the ledger before it is acted on, so a controller that is killed and
started again adopts the jobs its predecessor left running instead of submitting them twice. One
run's trouble (a submission the scheduler refuses) stays that run's; a scheduler that does not
answer at all stops the drill after restart.scheduler_timeout_s, its jobs left to a rerun. The
scheduler is polled at its own, slower pace (orchestrator.observe.scheduler_poll).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

from experiments.file_changes import FileChanges
from experiments.runtime.fence import Fence, sync_filesystem, write_fence
from injectors.kinds import get_kind
from injectors.schedule import PlannedFault, seeded_rng
from orchestrator.at_once import at_once
from orchestrator.backends import backend_class, make_backend
from orchestrator.backends.base import Backend, SubmitLimit
from orchestrator.backends.scheduler_calls import SchedulerCalls
from orchestrator.campaign.capabilities import Capability
from orchestrator.campaign.directives import qos_of
from orchestrator.campaign.forking import forking_launcher, forking_note
from orchestrator.campaign.programs import (
    missing_programs,
    missing_scripts,
    mpi_refusals,
    mpi_warnings,
    wrapper_warnings,
)
from orchestrator.campaign.runs import RunConfig, expand_runs
from orchestrator.campaign.spec import Campaign, SpecError
from orchestrator.commands import CommandError, one_line
from orchestrator.control.checkpoint_home import checkpoint_home_refusals, link_checkpoint_homes
from orchestrator.control.scheduler_queue import SchedulerQueue
from orchestrator.control.ticks import Ticks
from orchestrator.control.tracker import RunTracker
from orchestrator.control.workdir import claim_workdir
from orchestrator.faults.job_control import (
    Menders,
    disk_full_refusals,
    memory_limit_refusals,
    node_fault_refusals,
    privilege_refusals,
)
from orchestrator.observe.node_check import CheckPool
from orchestrator.observe.node_clocks import ClockBook
from orchestrator.observe.scheduler_poll import SchedulerPoller
from orchestrator.record.ledger import Ledger, RunRow
from orchestrator.record.ledger_home import bring_home, place_ledger
from orchestrator.record.measure import record_determinism
from orchestrator.render.scripts import array_job_name
from orchestrator.states import JobState

log = logging.getLogger(__name__)

Observer = Callable[[list[RunTracker], list[RunTracker]], None]  # (every run, those this round touched)


def plan_faults(run: RunConfig) -> list[PlannedFault]:
    """The run's faults with their delays and targets drawn from a generator seeded by the run:
    the same spec gives the same plan. An entry with ``repeat`` makes that many faults."""
    rng = seeded_rng(run.campaign.name, run.run_id, run.campaign.workload.seed)
    plan: list[PlannedFault] = []
    for fault in run.campaign.faults:
        kind = get_kind(fault.kind)
        for _ in range(fault.repeat):
            ranks = kind.plan_ranks(fault, run.ranks, rng)
            delay = fault.after.draw(rng, ranks=run.ranks, nodes=run.campaign.resources.nodes)
            options = fault.kind_options()
            options.pop("rank", None)  # drawn: the plan names the ranks
            plan.append(PlannedFault(
                index=len(plan), kind=fault.kind, delay_s=delay, anchor=fault.anchor, ranks=ranks, options=options,
                target=kind.describe(ranks, options), at_step=getattr(fault.after, "at_step", None),
            ))
    return plan


def plan_drill(campaign: Campaign, site: type[Backend] | None = None) -> list[tuple[RunConfig, list[PlannedFault]]]:
    """Every run and its planned faults; raises SpecError before anything is created, also for a
    program the ranks start that is not there (on this machine; a cluster's compute nodes alone can
    tell, so there it is a warning), or for what the site cannot do (``site``: the backend whose
    site is asked; the spec's backend by default)."""
    runs = expand_runs(campaign)
    missing = missing_programs(runs) + missing_scripts(runs)
    site = site or backend_class(campaign.backend)
    refusals = (mpi_refusals(runs) + node_fault_refusals(runs)
                + privilege_refusals(runs, confines_memory=site.confines_memory)
                + memory_limit_refusals(runs, site.confines_memory) + disk_full_refusals(runs)
                + site.site_refusals(runs)
                + checkpoint_home_refusals(runs)
                + ([item.line() for item in missing] if campaign.backend == "local" else []))
    if refusals:
        raise SpecError("\n".join(refusals))
    for item in missing:
        log.warning("%s; the compute nodes may have it, this node does not", item.line())
    for line in mpi_warnings(runs) + wrapper_warnings(runs):
        log.warning("%s", line)
    for line in launcher_notes(runs):
        log.warning("%s", line)
    return [(run, plan_faults(run)) for run in runs]


def launcher_notes(runs: list[RunConfig]) -> list[str]:
    """What the drill can and cannot target under a forking launcher in a run's command (one line
    per launcher: a sweep's runs share it)."""
    notes: dict[str, str] = {}
    for run in runs:
        command = run.campaign.workload.command
        if command is not None and not run.torchrun and (launcher := forking_launcher(command)) is not None:
            notes.setdefault(launcher.name, forking_note(run.run_id, launcher))
    return list(notes.values())


def _register_runs(ledger: Ledger, runs: list[RunConfig]) -> None:
    """Every run in the ledger, in one commit (a commit each: 10,000 fsyncs for a sweep of 10,000)."""
    with ledger.transaction():
        for run in runs:
            _register_run(ledger, run)


def _register_run(ledger: Ledger, run: RunConfig) -> None:
    ledger.add_run(RunRow(
        run_id=run.run_id, framework=run.campaign.workload.framework, ranks=run.ranks,
        nodes=run.campaign.resources.nodes, strategy=run.campaign.restart.strategy, target_steps=run.workload.steps,
        baseline_of=run.baseline_of, config=json.dumps(run.campaign.model_dump(mode="json"), sort_keys=True),
        model=run.model_name, requested_params=0 if run.command else run.campaign.workload.params, twin=run.twin,
    ))


def _drill_id(ledger: Ledger, campaign: Campaign) -> str:
    drill_id = ledger.meta("drill_id")
    if drill_id is None:
        drill_id = f"{campaign.name}-{secrets.token_hex(4)}"
        ledger.set_meta("drill_id", drill_id)
        ledger.set_meta("campaign", campaign.name)
        ledger.set_meta("backend", campaign.backend)
        ledger.set_meta("created", time.time())
        ledger.set_meta("spec", campaign.model_dump(mode="json"))
    return str(drill_id)


INJECTORS_PER_RUN = 4  # faults of one run acting at once (a corrupt-checkpoint beside a kill, ...)
NODE_CHECKS_AT_ONCE = 4  # silent nodes checked at once (each an srun of at most its timeout)
CANCEL_POLL_S = 1.0  # how often ``cancel`` asks the scheduler whether the cancelled jobs ended


@dataclass(frozen=True)
class CancelOutcome:
    cancelled: dict[str, list[str]]  # run id -> the jobs the scheduler was asked to cancel
    alive: list[str]  # jobs it refused to cancel or did not show ended: their runs are not recorded cancelled


def _gone(state: JobState | None) -> bool:
    """The scheduler shows the job ended, or no longer knows it."""
    return state is not None and (state.is_terminal or state is JobState.UNKNOWN)


class Controller:
    def __init__(self, campaign: Campaign, backend: Backend | None = None,
                 plan: list[tuple[RunConfig, list[PlannedFault]]] | None = None) -> None:
        # Spec errors before any file; a backend given is its own site (a test's recorded scheduler).
        self.plan = plan if plan is not None else plan_drill(campaign, type(backend) if backend is not None else None)
        claim_workdir(campaign)  # the user's alone (or the team's, as the spec says), before anything is read
        self.campaign = campaign
        self.ledger = Ledger(place_ledger(campaign.workdir, campaign.ledger_dir))
        self.drill_id = _drill_id(self.ledger, campaign)
        self.backend = backend or make_backend(campaign.backend, self.drill_id)
        self.runs = [run for run, _ in self.plan]
        _register_runs(self.ledger, self.runs)
        link_checkpoint_homes(self.runs, self.drill_id)  # before anything is submitted
        restart = campaign.restart
        interval = restart.scheduler_poll_s if restart.scheduler_poll_s is not None else self.backend.poll_interval_s
        self.poller = SchedulerPoller(interval, restart.scheduler_timeout_s, background=interval > 0)
        self.backend.set_patience(restart.scheduler_timeout_s)
        self._notes_recorded: list[str] = []  # the site notes already in the ledger
        self.submit_limit = self.backend.max_submit_jobs(qos_of(campaign.resources.extra_directives),
                                                         campaign.resources.partition)
        self.parallel_runs = parallel_runs_of(campaign, self.runs)
        self.in_flight_limit, self._limit_notes = in_flight_limit(self.parallel_runs, len(self.runs), self.submit_limit)
        self._ended_jobs: set[str] = set()  # jobs of the drill seen ended: a new one frees a held submission
        self.calls = SchedulerCalls(off_loop=self.backend.slow_commands)  # submissions and cancels
        # which of the runs' files were written (inotify): a round reads only those (on this host's
        # own filesystem; None where the kernel gives none: every file looked up each round)
        self.changes = FileChanges.open()
        self._cpu_at_start = time.process_time()
        self.ticks = Ticks(restart.poll_interval_s)  # the loop's schedule, and how far behind it ran
        self.stop_requested = threading.Event()  # set by SIGTERM (faultdrill stop): stop at the next round
        self._trackers: list[RunTracker] = []  # the runs driven (their node checks' counts are recorded)

    def run(self, observer: Observer | None = None) -> bool:
        """Drive every run to completed, failed or gave_up; False if asked to stop first (``stop``:
        the jobs are left running for the next controller to adopt)."""
        menders = Menders(self.campaign.workdir)
        self._mend(menders, "owed by an earlier controller")  # it died with a node still broken
        pools = self.injector_pools()
        clocks = ClockBook(self.backend)
        node_checks = self.node_check_pool()
        trackers = self._trackers = self.trackers(pools, clocks, node_checks)
        now = time.time()
        for tracker in trackers:
            tracker.reclaim_cancels(now)
        try:
            self._drive(trackers, observer)
            # Submissions and requeues in flight when the loop stopped (faultdrill stop): their
            # answers are taken, so the next controller (or a cancel) knows their jobs.
            self.calls.close()
            for tracker in trackers:
                tracker.submitter.take_answer()
                tracker.requeuer.take_answer()
        finally:
            for pool in pools.values():
                pool.shutdown(wait=True)  # a fault still acting may owe a mend
            self._mend(menders, "at the end of the drill" if not self.stop_requested.is_set() else "on stop")
            clocks.close()  # after the mends: a read under way may wait on a node that does not answer
            if node_checks is not None:
                node_checks.shutdown()  # a check under way ends within its timeout
            for tracker in trackers:
                if tracker.done:
                    tracker.finalize()
        if self.stop_requested.is_set() and not all(tracker.done for tracker in trackers):
            self.ledger.set_meta(f"stopped-{time.time():.3f}", "the controller was asked to stop; jobs left running")
            return False
        record_determinism(self.ledger, self.runs)
        self.ledger.set_meta("finished", time.time())
        return True

    def cancel(self, confirm_timeout_s: float | None = None) -> CancelOutcome:
        """``faultdrill cancel``: every unfinished run's jobs cancelled, owed cluster actions run.
        A run is recorded cancelled, and the drill finished, only once the scheduler confirms that
        its jobs ended (or no longer knows them) within ``confirm_timeout_s`` (default
        restart.cancel_timeout_s); a job it refused to cancel, or could not account for, is named
        in ``alive`` and nothing of its run is recorded (``cancel`` again to retry)."""
        menders = Menders(self.campaign.workdir)
        pools = self.injector_pools()
        try:
            trackers = self.trackers(pools)
            asked = {tracker.run.run_id: tracker.ask_cancel() for tracker in trackers}
            refused = [job for _, jobs in asked.values() for job in jobs]
            unconfirmed = self._not_ended([job for jobs, _ in asked.values() for job in jobs if job not in refused],
                                          confirm_timeout_s if confirm_timeout_s is not None
                                          else self.campaign.restart.cancel_timeout_s)
            alive = refused + unconfirmed
            now = time.time()
            for tracker in trackers:
                if not set(asked[tracker.run.run_id][0]) & set(alive):
                    tracker.record_cancelled(now)
        finally:
            for pool in pools.values():
                pool.shutdown(wait=True)
        self._mend(menders, "on cancel")
        if not alive:
            self.ledger.set_meta("cancelled", now)
            self.ledger.set_meta("finished", now)
        return CancelOutcome({run_id: jobs for run_id, (jobs, _) in asked.items()}, alive)

    def _not_ended(self, job_ids: list[str], timeout_s: float) -> list[str]:
        """Of ``job_ids``, those the scheduler has not shown ended (or forgotten) by the deadline:
        all of them while it does not answer."""
        deadline = time.monotonic() + timeout_s
        waiting = list(job_ids)
        while waiting:
            try:
                states = self.backend.poll(waiting)
            except CommandError as error:
                log.warning("the scheduler did not answer whether the cancelled jobs ended: %s", one_line(error))
                states = {}
            waiting = [job for job in waiting if not _gone(states.get(job))]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(min(CANCEL_POLL_S, max(0.0, deadline - time.monotonic())))
        return waiting

    def injector_pools(self) -> dict[str, ThreadPoolExecutor]:
        """A pool of fault threads per run (threads start only when a fault acts): no fault waits
        behind another run's long one (a node crash's hold, a stall, a disk-full)."""
        return {run.run_id: ThreadPoolExecutor(max_workers=INJECTORS_PER_RUN, thread_name_prefix=f"injector-{run.run_id}")
                for run in self.runs}

    def trackers(self, pools: dict[str, ThreadPoolExecutor], clocks: ClockBook | None = None,
                 node_checks: CheckPool | None = None) -> list[RunTracker]:
        return [RunTracker(run, faults, self.backend, self.ledger, pools[run.run_id], self.drill_id, self.calls,
                           clocks, node_checks, self.changes) for run, faults in self.plan]

    def node_check_pool(self) -> CheckPool | None:
        """The threads that check silent nodes (orchestrator/observe/node_check.py): where jobs span
        nodes and restart.node_silence_s asks for it; threads start only when a check is due."""
        if not self.backend.offers(Capability.MULTI_NODE) or self.campaign.restart.node_silence_s <= 0:
            return None
        return CheckPool(NODE_CHECKS_AT_ONCE)

    def _mend(self, menders: Menders, when: str) -> None:
        for said in menders.run_all():
            log.info("cluster action %s: %s", when, said)
            self.ledger.set_meta(f"mended-{time.time():.3f}", f"{when}: {said}")

    def _drive(self, trackers: list[RunTracker], observer: Observer | None) -> None:
        waiting = [t for t in trackers if not t.done]
        # Runs an earlier controller left in flight hold their jobs: watched at once, whatever the
        # limits (one of them may be lower now than when they went out).
        active = [t for t in waiting if not t.fresh]
        waiting = [t for t in waiting if t.fresh]
        for tracker in active:
            tracker.start(time.time(), durable=False)
        if active:  # their fences, made durable together before any round acts on them
            sync_filesystem(self.campaign.workdir)
        # Runs whose job waits in the scheduler's queue, unheard (an array's pending elements):
        # out of the rounds until the scheduler starts them (scheduler_queue.py).
        queued = SchedulerQueue()
        if self.campaign.submit_as_array and self.backend.offers(Capability.ARRAYS):
            arrayed = self._submit_arrays(waiting, self.in_flight_limit - len(active), self._jobs_held(trackers))
            active += self._queue_unheard(arrayed, queued)
            went = set(map(id, arrayed))
            waiting = [t for t in waiting if id(t) not in went]
        ticks = self.ticks
        queue = deque(waiting)
        closing = [t for t in trackers if t.closing]  # a failed job still finishing (an earlier controller's)
        first_round = True  # its observers see every run once
        while (queue or active or closing or queued) and not self.stop_requested.is_set():
            while (queue and len(active) + len(queued) < self.in_flight_limit
                   and self._room_for_a_job(_busy(active, closing), also_held=len(queued))):
                tracker = queue.popleft()
                tracker.start(time.time())
                active.append(tracker)
            # This round's work is its runs in flight and those whose failed job is still closing:
            # a run that waits for its turn or has ended (its jobs gone) costs it nothing (issue 29),
            # nor one whose job waits in the scheduler's queue (each array's lowest: a look at the disk).
            busy = _busy(active, closing)
            states = self._poll(busy, active, queued)
            back = queued.take_back(states, begun=RunTracker.attempt_begun)
            active, busy = active + back, busy + back
            self._advance(active, busy, states)
            closing = [t for t in busy if t.closing]
            active = self._queue_unheard([t for t in active if not t.done], queued)
            if observer is not None:
                observer(trackers, trackers if first_round else busy)
            first_round = False
            if queue or active or closing or queued:
                ticks.wait(self.stop_requested)

    @staticmethod
    def _queue_unheard(active: list[RunTracker], queued: SchedulerQueue) -> list[RunTracker]:
        """The runs in flight after a round, less those whose job waits in the scheduler's queue
        unheard: they wait in ``queued``."""
        flying = []
        for tracker in active:
            if not tracker.queued_unheard:
                flying.append(tracker)
            else:
                queued.park(tracker)
        return flying

    def _jobs_held(self, trackers: list[RunTracker]) -> int:
        """The drill's jobs the scheduler may still count: current ones and failed ones finishing."""
        return sum(len(tracker.watched_job_ids()) for tracker in trackers)

    def _room_for_a_job(self, trackers: list[RunTracker], also_held: int = 0) -> bool:
        """Under a site's limit of submitted jobs, a new run's job fits beside those the drill holds
        (a failed attempt's job counts until it has ended; ``also_held``: jobs waiting in the queue)."""
        return self.submit_limit is None or self._jobs_held(trackers) + also_held < self.submit_limit.jobs

    def _submit_arrays(self, fresh: list[RunTracker], budget: int, jobs_held: int = 0) -> list[RunTracker]:
        """The first attempts of fresh runs, one job array per set of runs with equal resources
        (the scheduler throttles each to parallel_runs), in parts of at most the site's
        MaxArraySize. Returns the runs that went out; those of an array the scheduler did not take
        wait their turn with the others (started, each is looked up, then submitted on its own:
        parallel_runs at a time, not all at once). ``budget`` runs may run at once; under a site's
        limit of submitted jobs (each element counts, pending or not), the arrays hold no more runs
        than fit beside the ``jobs_held``; the rest wait."""
        if self.submit_limit is not None:
            fresh = fresh[:max(0, self.submit_limit.jobs - jobs_held)]
        groups: dict[str, list[RunTracker]] = {}
        for tracker in fresh:
            key = json.dumps([tracker.run.campaign.resources.model_dump(mode="json"),
                              tracker.run.campaign.workload.framework])
            groups.setdefault(key, []).append(tracker)
        size = max(1, self.backend.max_array_size())
        parts = [group[start:start + size] for group in groups.values() for start in range(0, len(group), size)]
        throttles = array_throttles([len(part) for part in parts], budget)
        return [tracker for part, throttle in zip(parts, throttles, strict=True) if throttle
                for tracker in self._submit_array(part, throttle)]

    def _submit_array(self, group: list[RunTracker], throttle: int) -> list[RunTracker]:
        """One array of ``group``'s first attempts, at most ``throttle`` of them running at once;
        the runs that went out (none if it was refused)."""
        name = array_job_name([t.run for t in group], 0, self.drill_id) if len(group) > 1 else None
        # One ledger transaction and one sync of the fences for the whole group, not one per run
        # (a 1000-run sweep: 4000 fsyncs and 2000 commits took most of its submission time); the
        # fences written side by side (each a create and a rename: at_once).
        with self.ledger.transaction():
            jobs = [tracker.begin_attempt(0, name, index if name else None, fence=False)
                    for index, tracker in enumerate(group)]
        self._fence_all([(tracker, None) for tracker in group])
        try:
            submissions = self.backend.submit_array([(t.run, job) for t, job in zip(group, jobs, strict=True)], throttle)
        except (CommandError, OSError) as error:
            log.warning("submitting an array of %d runs failed (%s); each is looked up, then tried on its own, "
                        "parallel_runs at a time", len(group), one_line(error))
            return []
        with self.ledger.transaction():
            for tracker, submission in zip(group, submissions, strict=True):
                tracker.accept(0, submission, fence=False)
        self._fence_all([(tracker, submission.job_id) for tracker, submission in zip(group, submissions, strict=True)])
        return group

    def _fence_all(self, fences: list[tuple[RunTracker, str | None]]) -> None:
        """Each run's fence on its first attempt (of ``job_id``, once known), made durable together."""
        at_once(lambda fence: write_fence(fence[0].run.paths, Fence(0, fence[1], self.drill_id), durable=False), fences)
        sync_filesystem(self.campaign.workdir)

    def _poll(self, busy: list[RunTracker], active: list[RunTracker], queued: SchedulerQueue) -> dict[str, JobState]:
        """The scheduler's states when a poll was due (a job absent from them has no news this
        round). ``busy``: the runs in flight and those whose failed job is closing; with the jobs
        waiting in ``queued``, every job the drill still watches."""
        def job_ids() -> list[str]:  # listed only when a poll is due
            return [job_id for tracker in busy for job_id in tracker.watched_job_ids()] + queued.job_ids()
        return self.poller.poll(self.backend, job_ids, urgent=any(tracker.awaits_scheduler for tracker in active))

    def _advance(self, active: list[RunTracker], busy: list[RunTracker], states: dict[str, JobState]) -> None:
        """Every run's files at the fast interval, with the scheduler's ``states`` of this round."""
        trackers = busy
        now = time.time()
        for tracker in trackers:
            tracker.settle_closing(states, now)
        if self.changes is not None:
            self.changes.drain()  # before the reads: what was written up to now
        with self.ledger.transaction():  # what every run in flight showed this round: one commit
            for tracker in active:
                tracker.observe(states, now, asked_at=self.poller.answered_as_of)
        for tracker in active:
            tracker.advance(states, now, asked_at=self.poller.answered_as_of)
        if states:
            self._free_held_submissions(states, active, now)
            self._record_site_notes()  # as they come: a controller killed later keeps them

    def _free_held_submissions(self, states: dict[str, JobState], active: list[RunTracker], now: float) -> None:
        """A job of the drill that ended frees a place under the site's limit of submitted jobs: a
        submission held by it is tried again now, not at its next regular try."""
        ended = {job for job, state in states.items() if _gone(state)}
        if ended - self._ended_jobs:
            for tracker in active:
                tracker.submitter.held_freed(now)
        self._ended_jobs |= ended

    def close(self) -> None:
        self.calls.close()
        if self.changes is not None:
            self.changes.close()
        self.poller.close()
        self._record_cost()
        self._record_site_notes()
        finished = self.ledger.meta("finished") is not None
        self.ledger.close()
        if finished:  # a ledger kept in ledger_dir goes with the runs now
            bring_home(self.campaign.workdir)

    def _record_site_notes(self) -> None:
        """What the site did not give this drill (the backend says), kept with every earlier controller's."""
        said = self._limit_notes + self.backend.site_notes()
        if not said or said == self._notes_recorded:
            return
        notes = list(self.ledger.meta("site_notes") or [])
        new = [note for note in said if note not in notes]
        if new:
            self.ledger.set_meta("site_notes", notes + new)
        self._notes_recorded = said

    def _record_cost(self) -> None:
        """What the drill cost the scheduler and the login node, summed over the controllers a
        drill had (one that was stopped and started again)."""
        stats, before = self.poller.stats, self.ledger.meta("controller_cost") or {}
        self.ledger.set_meta("controller_cost", {
            "scheduler_polls": before.get("scheduler_polls", 0) + stats.calls,
            "scheduler_poll_commands": before.get("scheduler_poll_commands", 0) + stats.commands,
            "scheduler_poll_failures": before.get("scheduler_poll_failures", 0) + stats.failures,
            "scheduler_wait_s": round(before.get("scheduler_wait_s", 0.0) + stats.seconds, 3),
            "controller_cpu_s": round(before.get("controller_cpu_s", 0.0) + time.process_time() - self._cpu_at_start, 3),
            "scheduler_poll_interval_s": self.poller.interval_s,
            "rounds": before.get("rounds", 0) + self.ticks.rounds,
            "rounds_behind": before.get("rounds_behind", 0) + self.ticks.rounds_behind,
            "behind_ms_max": round(max(before.get("behind_ms_max", 0.0), 1000 * self.ticks.behind_s_max), 1),
            "node_checks": self._node_check_counts(before.get("node_checks") or {}),
        })

    def _node_check_counts(self, before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """Per run that had any: the silences its node checks looked at, found alive, found a node
        lost in (orchestrator/observe/node_check.py), added to earlier controllers'."""
        counts = {run_id: dict(seen) for run_id, seen in before.items()}
        for tracker in self._trackers:
            checks = tracker.node_checks
            if checks is None or not checks.counts.silences:
                continue
            mine = counts.setdefault(tracker.run.run_id, {})
            for key, value in asdict(checks.counts).items():
                mine[key] = mine.get(key, 0) + value
        return counts


def _busy(active: list[RunTracker], closing: list[RunTracker]) -> list[RunTracker]:
    """The runs a round works on, each once: those in flight and those whose failed job is closing
    (a run may be both: its next attempt runs while its failed job ends)."""
    flying = set(map(id, active))
    return active + [tracker for tracker in closing if id(tracker) not in flying]


def parallel_runs_of(campaign: Campaign, runs: list[RunConfig]) -> int:
    """The spec's parallel_runs, or the backend's default where it says none: 1 on Slurm and PBS;
    on the local backend, one run per two cores for each rank of its largest run."""
    if campaign.parallel_runs is not None:
        return campaign.parallel_runs
    if campaign.backend != "local":
        return 1
    return local_parallel_runs(max((run.ranks for run in runs), default=1))


def local_parallel_runs(ranks_per_run: int, cores: int | None = None) -> int:
    """One run per two cores for each of its ranks (a rank's own core, and one for its supervisor,
    the injector and the controller), at least one: runs that share cores would measure each
    other's load, not their recovery. ``cores``: those this process may run on."""
    cores = cores if cores is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1)
    return max(1, cores // (2 * max(1, ranks_per_run)))


def in_flight_limit(parallel_runs: int, runs: int, limit: SubmitLimit | None) -> tuple[int, list[str]]:
    """How many runs may be in flight at once: parallel_runs, or the site's limit of jobs one may
    have submitted where that is lower (a run in flight holds one job); and the site note that says
    so, where it binds. A limit of 0 is a SpecError: no job could go out."""
    if limit is None or limit.jobs >= parallel_runs:
        return parallel_runs, []
    if limit.jobs < 1:
        raise SpecError(f"the site allows you no submitted jobs ({limit.source} is {limit.jobs}): no run could go "
                        "out; ask for a limit, or use another account or QOS (resources.extra_directives)")
    note = (f"the site's limit of submitted jobs ({limit.source}: {limit.jobs}) is below parallel_runs "
            f"{parallel_runs}: at most {limit.jobs} runs were in flight at once")
    return limit.jobs, [note] if limit.jobs < runs else []


def array_throttles(sizes: list[int], parallel_runs: int) -> list[int]:
    """How many elements of each array may run at once: parallel_runs shared out (each array its
    own throttle, so together they never run more), one at a time to each array that has runs
    left. An array that gets none waits: its runs go out later, parallel_runs at a time."""
    throttles = [0] * len(sizes)
    left = parallel_runs
    while left > 0 and any(throttle < size for throttle, size in zip(throttles, sizes, strict=True)):
        for index, size in enumerate(sizes):
            if left > 0 and throttles[index] < size:
                throttles[index] += 1
                left -= 1
    return throttles
