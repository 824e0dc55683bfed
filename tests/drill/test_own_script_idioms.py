"""Issue 27: the resume idioms users really write, drilled zero-code as the README says, each
report held against what the script itself logged and left. Keras 3's BackupAndRestore
(experiments/examples/keras_backup.py), killed mid-epoch: the report's resumed step and lost steps
are the script's own, a resume that ran more optimizer steps than planned is named, and the final
weights (workload.outputs) are compared with the twin's as the test compares them itself."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from step_logs import executed

from drills import drill
from faultdrill_cli import campaign_copy


def _weights(path: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda key, item: found.__setitem__(key, item[()]) if isinstance(item, h5py.Dataset) else None)
    return found


def test_keras_backup_and_restore_killed_mid_epoch_is_reported_as_it_ran(tmp_path: Path) -> None:
    report = drill(campaign_copy("example-keras-backup", tmp_path), timeout=600)
    [run] = [run for run in report["runs"] if not run["is_baseline"]]
    [twin] = [run for run in report["runs"] if run["is_baseline"]]
    assert run["status"] == "completed" and twin["status"] == "completed", run
    runs = tmp_path / "work" / "runs"
    steps = executed(runs / run["run_id"] / "steps-0.log")
    failed_pid = steps[0].pid
    later = [step for step in steps if step.pid != failed_pid]
    [recovery] = run["recoveries"]
    # Keras restored its backup: the optimizer's iterations go on from it.
    assert recovery["resumed_from_step"] == later[0].step - 1, (recovery, later[0])
    assert recovery["resumed_from_step"] % 20 == 0 and recovery["resumed_from_step"] < 90
    reached = max(step.step for step in steps if step.pid == failed_pid and step.at <= recovery["fault_at"])
    assert reached - 2 <= recovery["resumed_from_step"] + recovery["lost_steps"] <= reached, (recovery, reached)
    # More optimizer steps than planned if Keras started the epoch over: the report says so.
    final = max(step.step for step in later)
    assert run["final_step"] == final
    assert ("replayed" in run["progress"]) == (final > run["target_steps"]), (final, run["progress"])
    # The weights as the test reads them against what the report says of them.
    mine = _weights(runs / run["run_id"] / "work" / "final.weights.h5")
    theirs = _weights(runs / twin["run_id"] / "work" / "final.weights.h5")
    largest = max(float(np.max(np.abs(mine[key] - theirs[key]))) for key in mine)
    assert run["identical_to_baseline"] is (largest == 0.0), (largest, run["outputs"])
    assert run["max_abs_weight_diff"] == (largest if largest else 0.0), (largest, run["max_abs_weight_diff"])
    assert run["outputs"]["verdict"] == ("identical" if largest == 0.0 else "differs")
