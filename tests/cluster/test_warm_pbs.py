"""restart.strategy warm through the PBS commands of the local cluster (issue 12),
experiments/campaigns/warm-pbs.yaml: the batch script runs the job's warm coordinator, which
launches every rank and spare with an mpiexec of its own (Chainer: every spare set one mpiexec, an
MPI world of its own). Chainer: each of two rank SIGKILLs answered in the same job by a whole spare
set handed the survivors' state (issue 24: state source "peer", at most one step lost). With FAULTDRILL_FULL=1 also TensorFlow's sets (drilled
locally in CI) and PyTorch (each kill answered by a spare and a survivor's state): ~1.5 min less
in CI. PyTorch's warm spares stay CI's on a real cluster through Slurm
(tests/cluster/test_warm_slurm.py, a job step per member); their launch through PBS (an
``mpiexec -n 1`` per member, experiments/warm/batch_host.py MpiexecMembers.member) is drilled
with FAULTDRILL_FULL=1 only. Every run ends bit for bit as its twin."""

from __future__ import annotations

from pathlib import Path

from campaigns import campaign_copy, drill_report, full_campaigns, keep_sweep_points
from warm_checks import assert_peer_recoveries, assert_spare_sets_recovered


def test_warm_spares_and_spare_sets_through_pbs_mpiexec(shared_tmp: Path, cluster, slurm) -> None:
    spec = campaign_copy("warm-pbs", shared_tmp)
    full = full_campaigns()
    sets = ["chainer", "tensorflow"] if full else ["chainer"]
    peers = ["torch"] if full else []
    keep_sweep_points(spec, lambda point: point["workload.framework"][0] in [*peers, *sets])
    report = drill_report(spec, timeout_s=900)
    assert report["backend"] == "pbs"
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"].split(".")[0])
    faulted = {run["framework"]: run for run in report["runs"] if not run["is_baseline"]}
    assert sorted(faulted) == sorted([*peers, *sets])
    for framework in peers:
        run_dir = shared_tmp / "work" / "runs" / faulted[framework]["run_id"]
        assert_peer_recoveries(faulted[framework], run_dir, faults=2)
    for framework in sets:
        run_dir = shared_tmp / "work" / "runs" / faulted[framework]["run_id"]
        assert_spare_sets_recovered(faulted[framework], run_dir, faults=2)
