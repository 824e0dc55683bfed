"""restart.strategy warm through the PBS commands of the local cluster (issue 12),
experiments/campaigns/warm-pbs.yaml: the batch script runs the job's warm coordinator, which
launches every rank and spare with an mpiexec of its own (Chainer: every spare set one mpiexec, an
MPI world of its own). PyTorch: each of two rank SIGKILLs answered in the same job by a spare and a
survivor's state; Chainer: by a whole spare set from the newest valid checkpoint. Both runs end bit
for bit as their twins."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaigns import campaign_copy, drill_report
from warm_checks import assert_peer_recoveries, assert_spare_sets_recovered

pytestmark = pytest.mark.integration


def test_warm_spares_and_spare_sets_through_pbs_mpiexec(shared_tmp: Path, cluster, slurm) -> None:
    report = drill_report(campaign_copy("warm-pbs", shared_tmp), timeout_s=900)
    assert report["backend"] == "pbs"
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"].split(".")[0])
    faulted = {run["framework"]: run for run in report["runs"] if not run["is_baseline"]}
    assert sorted(faulted) == ["chainer", "torch"]
    assert_peer_recoveries(faulted["torch"], faults=2)
    assert_spare_sets_recovered(faulted["chainer"], shared_tmp / "work" / "runs" / faulted["chainer"]["run_id"],
                                faults=2)
