"""restart.strategy warm on the real Slurm cluster (issue 12), experiments/campaigns/warm-slurm.yaml:
2-node PyTorch jobs with a warm spare on each node. Three rank SIGKILLs, each answered in the same
job by a spare and a survivor's state; a node crash answered by the spare on the surviving node
(each rank and spare is a job step of its own: the crash ends only the steps on that node). Every
run ends bit for bit as its twin. TensorFlow and Chainer (warm-slurm-frameworks.yaml): whole spare
sets, each one job step of both nodes' tasks, handed the survivors' state (issue 24: state source
"peer", at most one step lost; the checkpoint only where no survivor is left)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from campaigns import campaign_copy, drill_report, full_campaigns, keep_sweep_points
from experiments.layout import RunPaths
from warm_checks import StrangerOnTheNodes, assert_peer_recoveries, assert_spare_sets_recovered


def _by_kind(report: dict[str, Any], kind: str) -> dict[str, Any]:
    [run] = [run for run in report["runs"] if run["faults"] and run["faults"][0]["kind"] == kind]
    return run


def test_warm_spares_take_dead_ranks_and_a_dead_nodes_places(shared_tmp: Path, cluster, slurm) -> None:
    """... and a stranger on the cluster who knocks on each job's coordinator (across the nodes'
    network) is refused and counted, the runs unharmed (security issue 28)."""
    stranger = StrangerOnTheNodes(shared_tmp / "work" / "runs")
    try:
        report = drill_report(campaign_copy("warm-slurm", shared_tmp), timeout_s=900)
    finally:
        stranger.stop()
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"])

    faulted = [run for run in report["runs"] if not run["is_baseline"]]
    assert stranger.probed and all(run["warm_refused"] >= 1 for run in faulted), (stranger.probed, faulted)
    killed = _by_kind(report, "kill-rank")
    assert_peer_recoveries(killed, shared_tmp / "work" / "runs" / killed["run_id"])
    assert len(killed["recoveries"]) == 3 and all(f["outcome"] == "injected" for f in killed["faults"])
    assert all(r["failure_class"] == "RANK_SIGNAL" for r in killed["recoveries"]), killed["attempts"]

    crashed = _by_kind(report, "node-crash")
    assert_peer_recoveries(crashed, shared_tmp / "work" / "runs" / crashed["run_id"])
    [recovery] = crashed["recoveries"]
    assert recovery["failure_class"] == "NODE_FAIL", recovery
    lost = crashed["faults"][0]["target"].removeprefix("node ")
    assert lost in cluster
    paths = RunPaths(shared_tmp / "work" / "runs" / crashed["run_id"])
    # Both ranks of the re-formed group run on the surviving node (the dead node's spare died with it).
    nodes = {json.loads(paths.rank_file(recovery["attempt"], rank).read_text())["node"] for rank in range(2)}
    assert len(nodes) == 1 and lost not in nodes, (nodes, lost)


def test_warm_spare_sets_restart_every_tensorflow_and_chainer_rank(shared_tmp: Path, cluster, slurm) -> None:
    """warm-slurm-frameworks.yaml: each of two rank SIGKILLs answered by a spare set (one step of
    both nodes' tasks) with a survivor's state, in the same job; a node crash answered by the
    spare set on the spare node, with the state of the rank on the node that lived. Every run ends as its twin. With FAULTDRILL_FULL=1 only (5 min
    here, its node crash alone 4 min of a 35-minute CI): in CI, spare sets answer SIGKILLs on a real
    cluster in tests/cluster/test_warm_pbs.py (Chainer) and a node crash under warm is drilled by
    the test above (PyTorch)."""
    if not full_campaigns():
        pytest.skip("the spare sets' node crash on Slurm runs with FAULTDRILL_FULL=1 (scripts/test --full)")
    spec = campaign_copy("warm-slurm-frameworks", shared_tmp)
    frameworks = ["chainer", "tensorflow"]
    keep_sweep_points(spec, lambda point: "faults" in point or point["workload.framework"][0] in frameworks)
    report = drill_report(spec, timeout_s=900)
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"])
    faulted = [run for run in report["runs"] if not run["is_baseline"]]
    killed = [run for run in faulted if run["faults"][0]["kind"] == "kill-rank"]
    assert sorted(run["framework"] for run in killed) == frameworks
    for run in killed:
        assert_spare_sets_recovered(run, shared_tmp / "work" / "runs" / run["run_id"], faults=2)

    crashed = _by_kind(report, "node-crash")
    assert crashed["status"] == "completed" and crashed["identical_to_baseline"] is True, crashed["attempts"]
    assert len({attempt["job_id"] for attempt in crashed["attempts"]}) == 1, "recovered in the same job"
    [recovery] = crashed["recoveries"]
    # The rank on the node that lived holds its state and serves it: no rollback after a node crash either.
    assert recovery["failure_class"] == "NODE_FAIL" and recovery["state_source"] == "peer", recovery
    assert recovery["lost_steps"] <= 1, recovery
    lost = crashed["faults"][0]["target"].removeprefix("node ")
    assert lost in cluster
    paths = RunPaths(shared_tmp / "work" / "runs" / crashed["run_id"])
    nodes = {json.loads(paths.rank_file(recovery["attempt"], rank).read_text())["node"] for rank in range(2)}
    assert len(nodes) == 2 and lost not in nodes, (nodes, lost)  # the set on the spare node
