"""restart.strategy warm for TensorFlow and Chainer on the local backend (issue 12), drilled through
the real CLI with experiments/campaigns/warm-frameworks.yaml: every rank SIGKILL is answered in the
same job by a warm spare set (its collective formed before the fault) that takes a survivor's held
state (no rollback: lost steps <= 1); a new set replaces it; each run ends bit for bit as its fault-free twin and no
process of the drill is left behind. Run with FAULTDRILL_FULL=1 (both frameworks, two kills each;
CI's own test of warm spare sets is Chainer's on a real cluster, tests/cluster/test_warm_pbs.py: this
one's three minutes of a CPU-bound lane kept CI past 35 minutes)."""

from __future__ import annotations

from pathlib import Path

import yaml

from drills import drill, drill_processes
from faultdrill_cli import FULL_ONLY, campaign_copy, full_campaigns, keep_sweep_points
from warm_checks import assert_spare_sets_recovered

# CI: one SIGKILL of a 175-step TensorFlow run (its spare set takes it, a new set starts behind it);
# FAULTDRILL_FULL=1: the campaign as it is (two kills a run, the second met by the job's other set).
CI_STEPS, CI_FAULTS = 175, 1


@FULL_ONLY
def test_every_sigkill_is_answered_by_a_warm_spare_set_and_every_run_ends_as_its_twin(tmp_path: Path) -> None:
    spec = campaign_copy("warm-frameworks", tmp_path)
    frameworks = ["chainer", "tensorflow"] if full_campaigns() else ["tensorflow"]
    keep_sweep_points(spec, lambda point: point["workload.framework"][0] in frameworks)
    faults = 2
    if not full_campaigns():
        faults = CI_FAULTS
        data = yaml.safe_load(spec.read_text())
        data["faults"][0]["repeat"] = CI_FAULTS
        for point in data["sweep"]["grid"]:
            point["workload.steps"] = [CI_STEPS]
        spec.write_text(yaml.safe_dump(data))
    report = drill(spec, timeout=900)
    faulted = [run for run in report["runs"] if not run["is_baseline"]]
    assert sorted(run["framework"] for run in faulted) == frameworks
    for run in faulted:
        run_dir = tmp_path / "work" / "runs" / run["run_id"]
        assert_spare_sets_recovered(run, run_dir, faults=faults)
        assert not drill_processes(run_dir), "a warm process outlived its job"
