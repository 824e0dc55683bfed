"""restart.strategy warm on the local backend (issue 12), drilled through the real CLI with
experiments/campaigns/warm.yaml: twelve rank SIGKILLs at random moments over two runs (2 and 3
ranks), each answered in the same job by a warm spare that takes the dead rank's place and a
survivor's state; every run ends bit for bit as its fault-free twin (nothing of a dropped step
reached the weights) and no process of the drill is left behind. That campaign runs with
FAULTDRILL_FULL=1, with a stranger on the node knocking on each job's coordinator meanwhile:
refused, counted in the report, and the runs still end as their twins. CI drills PyTorch's warm
kills, and the stranger, on the Slurm cluster (tests/cluster/test_warm_slurm.py), and the edges
below here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from recovery_checks import assert_phases_follow_the_moments

from drills import drill, drill_processes, memory_cgroup_writable, write_spec
from experiments.layout import RunPaths, attempt_event_lines
from faultdrill_cli import campaign_copy, full_campaigns
from orchestrator.backends.local.backend import LOCAL_CONTROLLER_MODULE
from warm_checks import Stranger


class LocalStranger(Stranger):
    """Another user of the node: finds the warm coordinators' listening ports (a job controller's, as
    `ss -ltn` lists them). The frameworks' own ports (TCPStore, gloo) are left alone: they are
    unauthenticated by design."""

    def coordinators(self) -> set[str]:
        ports = set()
        for run_dir in self.runs.glob("*"):
            for process in drill_processes(run_dir):
                try:
                    if LOCAL_CONTROLLER_MODULE in " ".join(process.cmdline()):
                        ports |= {c.laddr.port for c in process.net_connections("tcp") if c.status == "LISTEN"}
                except psutil.Error:
                    continue
        return {f"127.0.0.1:{port}" for port in ports}


def test_every_sigkill_is_answered_by_a_warm_spare_and_every_run_ends_as_its_twin(tmp_path: Path) -> None:
    if not full_campaigns():  # CI: warm PyTorch's kills on the Slurm cluster, and the edges below locally
        pytest.skip("the warm campaign's twelve kills run with FAULTDRILL_FULL=1 (scripts/test --full)")
    spec = campaign_copy("warm", tmp_path)
    ranks = [2, 3]
    data = yaml.safe_load(spec.read_text())
    data["sweep"]["grid"]["resources.tasks_per_node"] = ranks
    kills = data["faults"][0]["repeat"]
    spec.write_text(yaml.safe_dump(data))
    stranger = LocalStranger(tmp_path / "work" / "runs")
    try:
        report = drill(spec, timeout=900)
    finally:
        stranger.stop()
    faulted = [run for run in report["runs"] if not run["is_baseline"]]
    assert stranger.probed and all(run["warm_refused"] >= 1 for run in faulted), (stranger.probed, faulted)
    assert sorted(run["ranks"] for run in faulted) == ranks
    faults = [fault for run in faulted for fault in run["faults"]]
    assert len(faults) >= (kills - 1) * len(ranks) and all(fault["outcome"] == "injected" for fault in faults), faults
    for run in faulted:
        assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["run_id"]
        assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every re-formation in the same job"
        assert len(run["recoveries"]) == len(run["faults"]) == len(run["attempts"]) - 1
        for recovery in run["recoveries"]:
            assert recovery["strategy"] == "warm" and recovery["failure_class"] == "RANK_SIGNAL", recovery
            assert recovery["state_source"] == "peer" and recovery["spare"].startswith("slot "), recovery
            assert recovery["lost_steps"] <= 1 and recovery["queue_s"] < 0.5, recovery
            assert_phases_follow_the_moments(run, recovery, tmp_path / "work" / "runs" / run["run_id"])
        assert not drill_processes(tmp_path / "work" / "runs" / run["run_id"]), "a warm process outlived its job"



# The hardening issue's warm items, in one drill of three 2-rank runs: a preemption (item 14), a
# kill followed by a second one while the next generation forms (item 15), and the faults a rank
# acts out itself (oom-rank, then rank-error in the generation that replaced it: the soak found a
# warm rank that never took the agent's request).
EDGES = {
    "preempt": [{"kind": "preempt", "after": {"at_step": 200}, "grace_s": 10}],
    "reform": [{"kind": "kill-rank", "after": {"fixed": 1.0}, "rank": 1},
               {"kind": "kill-rank", "after": {"fixed": 0}, "anchor": "ranks_started", "rank": "random"}],
    "acted": [{"kind": "oom-rank", "after": {"fixed": 1.0}, "rank": 1},
              {"kind": "rank-error", "after": {"fixed": 1.0}, "rank": 0}],
}


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    # CI's cut (2026-12-06): the kill while the next generation forms alone (local warm PyTorch's
    # CI test: two kills, two peer recoveries); the preemption and the faults a rank acts out with
    # FAULTDRILL_FULL=1 (scripts/test --full).
    tmp_path = tmp_path_factory.mktemp("warm-edges")
    edges = EDGES if full_campaigns() else {"reform": EDGES["reform"]}
    spec = write_spec(tmp_path, baseline=False, parallel_runs=3, sweep={"grid": {"faults": list(edges.values())}},
                      workload={"framework": "torch", "params": 20000, "steps": 500, "step_s": 0.02, "seed": 4},
                      checkpoint={"every_steps": 100, "keep": 2}, resources={"nodes": 1, "tasks_per_node": 2},
                      restart={"strategy": "warm", "warm_spares": 2, "max_restarts": 4, "poll_interval_s": 0.05})
    return drill(spec, timeout=600), tmp_path / "work"


def _edge(edges: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    if name != "reform" and not full_campaigns():
        pytest.skip(f"the warm edge {name!r} runs with FAULTDRILL_FULL=1 (scripts/test --full)")
    [run] = [run for run in edges[0]["runs"] if run["faults"][0]["kind"] == EDGES[name][0]["kind"]]
    assert run["status"] == "completed" and run["final_step"] == 500, run["attempts"]
    assert not drill_processes(edges[1] / "runs" / run["run_id"]), "a warm process outlived its job"
    return run


def test_a_warm_jobs_ranks_save_on_the_preemption_warning_and_lose_no_work(edges) -> None:
    """Under warm, PyTorch's ranks checkpoint on the scheduler's warning (a preempt's SIGUSR2),
    hold without a re-formation, and the next job resumes from that step."""
    run = _edge(edges, "preempt")
    [fault] = run["faults"]
    saved = int(re.search(r"ranks saved step (\d+)", fault["detail"]).group(1))
    assert fault["outcome"] == "injected" and 200 <= saved < 500, fault
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "PREEMPTED" and recovery["resumed_from_step"] == saved, recovery
    assert recovery["lost_steps"] == 0, recovery
    events = attempt_event_lines(RunPaths(edges[1] / "runs" / run["run_id"]), 0)
    assert [event["step"] for event in events if event["event"] == "warned"] == [saved]
    assert not [event for event in events if event["event"] == "warm_failure"], "the warned ranks' end re-formed"


def test_a_kill_while_the_next_generation_forms_is_recovered_by_another_spare(edges) -> None:
    """The second kill lands as the re-formed generation's ranks start (its rendezvous, its state
    transfer): that generation is void, and the job goes on with another warm spare."""
    run = _edge(edges, "reform")
    assert [fault["outcome"] for fault in run["faults"]] == ["injected", "injected"], run["faults"]
    assert len({attempt["job_id"] for attempt in run["attempts"]}) == 1, "every re-formation in the same job"
    # A generation killed before its first step is part of the recovery that followed it (its
    # failed_restarts); one killed later, a recovery of its own.
    recoveries = run["recoveries"]
    assert len(recoveries) + sum(r["failed_restarts"] for r in recoveries) == 2, recoveries
    assert all(r["strategy"] == "warm" for r in recoveries) and len(run["attempts"]) == 3, run["attempts"]


def test_a_warm_rank_acts_out_the_faults_it_is_asked_to_in_every_generation(edges) -> None:
    """oom-rank and rank-error ask the rank itself (a leak, an exception): a warm rank takes the request
    of the attempt it trains in now, the second fault's a generation after the first."""
    run = _edge(edges, "acted")
    oom, error = run["faults"]
    if memory_cgroup_writable():
        assert oom["outcome"] == "injected" and "OOM killer ended it" in oom["detail"], oom
        expected = ["OUT_OF_MEMORY", "RANK_EXIT"]
    else:  # a site without a writable cgroup v1 memory controller: refused up front, with the reason
        assert oom["outcome"] == "refused" and "cgroup" in oom["detail"], oom
        expected = ["RANK_EXIT"]
    assert error["outcome"] == "injected" and error["attempt"] > 0, error
    assert [r["failure_class"] for r in run["recoveries"]] == expected, run["recoveries"]
    assert all(r["strategy"] == "warm" and r["state_source"] == "peer" for r in run["recoveries"]), run["recoveries"]
