"""The restart controller: runs a campaign to the end, one batched scheduler poll per interval.

Every decision is written to the ledger before it is acted on, so a controller that is killed and
started again adopts the jobs its predecessor left running instead of submitting them twice.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from injectors.schedule import DelayDistribution, PlannedFault, choose_rank, seeded_rng
from orchestrator.backends import make_backend
from orchestrator.backends.base import Backend
from orchestrator.commands import CommandError
from orchestrator.ledger import Ledger, RunRow
from orchestrator.measure import record_determinism
from orchestrator.runs import STRATEGY_RESUBMIT, RunConfig, expand_runs
from orchestrator.spec import Campaign, FixedDelay
from orchestrator.states import JobState
from orchestrator.tracker import RunTracker

log = logging.getLogger(__name__)

Observer = Callable[[list[RunTracker]], None]


def plan_faults(run: RunConfig) -> list[PlannedFault]:
    """The run's faults with their delays and targets drawn from a generator seeded by the run."""
    rng = seeded_rng(run.campaign.name, run.run_id, run.campaign.workload.seed)
    plan = []
    for index, fault in enumerate(run.campaign.faults):
        after = fault.after
        if isinstance(after, FixedDelay):
            delay = DelayDistribution(fixed_s=after.fixed)
        else:
            delay = DelayDistribution(mean_s=after.exponential, min_s=after.min, max_s=after.max)
        plan.append(PlannedFault(
            index=index, kind=fault.kind, rank=choose_rank(fault.rank, run.ranks, rng), signal=fault.signal,
            delay_s=delay.draw(rng), anchor=fault.anchor,
        ))
    return plan


def _register_runs(ledger: Ledger, runs: list[RunConfig]) -> None:
    for run in runs:
        ledger.add_run(RunRow(
            run_id=run.run_id, framework=run.campaign.workload.framework, ranks=run.ranks,
            nodes=run.campaign.resources.nodes, strategy=STRATEGY_RESUBMIT, target_steps=run.workload.steps,
            baseline_of=run.baseline_of, config=json.dumps(run.campaign.model_dump(mode="json"), sort_keys=True),
            model=run.campaign.workload.model, requested_params=run.campaign.workload.params,
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


class Controller:
    def __init__(self, campaign: Campaign, backend: Backend | None = None) -> None:
        campaign.workdir.mkdir(parents=True, exist_ok=True)
        self.campaign = campaign
        self.ledger = Ledger.in_workdir(campaign.workdir)
        self.drill_id = _drill_id(self.ledger, campaign)
        self.backend = backend or make_backend(campaign.backend, self.drill_id)
        self.runs = expand_runs(campaign)
        _register_runs(self.ledger, self.runs)

    def run(self, observer: Observer | None = None) -> None:
        """Drive every run to completed, failed or gave_up."""
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="injector") as pool:
            trackers = [RunTracker(run, plan_faults(run), self.backend, self.ledger, pool, self.drill_id)
                        for run in self.runs]
            waiting = [t for t in trackers if not t.done]
            active: list[RunTracker] = []
            if self.campaign.submit_as_array:
                arrayed = self._submit_arrays([t for t in waiting if t.fresh])
                active += arrayed
                waiting = [t for t in waiting if t not in arrayed]
            while waiting or active or any(t.closing for t in trackers):
                while waiting and len(active) < self.campaign.parallel_runs:
                    tracker = waiting.pop(0)
                    tracker.start()
                    active.append(tracker)
                self._advance(active, trackers)
                active = [t for t in active if not t.done]
                if observer is not None:
                    observer(trackers)
                if waiting or active or any(t.closing for t in trackers):
                    time.sleep(self.campaign.restart.poll_interval_s)
        record_determinism(self.ledger, self.runs)
        self.ledger.set_meta("finished", time.time())

    def _submit_arrays(self, fresh: list[RunTracker]) -> list[RunTracker]:
        """The first attempts of fresh runs, one job array per set of runs with equal resources."""
        groups: dict[str, list[RunTracker]] = {}
        for tracker in fresh:
            key = json.dumps([tracker.run.campaign.resources.model_dump(mode="json"),
                              tracker.run.campaign.workload.framework])
            groups.setdefault(key, []).append(tracker)
        for group in groups.values():
            jobs = [tracker.begin_attempt(0) for tracker in group]
            submissions = self.backend.submit_array([(t.run, job) for t, job in zip(group, jobs)])
            for tracker, submission in zip(group, submissions):
                tracker.accept(0, submission)
        return fresh

    def _advance(self, active: list[RunTracker], trackers: list[RunTracker]) -> None:
        job_ids = [job_id for tracker in trackers for job_id in tracker.watched_job_ids()]
        try:
            states = self.backend.poll(job_ids)
        except CommandError as error:
            # A scheduler that does not answer says nothing about the jobs: try again next round
            # rather than take them for vanished.
            log.warning("scheduler poll failed, retrying next interval: %s", error)
            return
        now = time.time()
        for tracker in trackers:
            tracker.settle_closing(states)
        for tracker in active:
            if tracker.job_id is not None:
                tracker.advance(states.get(tracker.job_id, JobState.UNKNOWN), now)

    def close(self) -> None:
        self.ledger.close()
