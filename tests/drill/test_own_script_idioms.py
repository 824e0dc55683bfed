"""Issue 27: the resume idioms users really write, drilled zero-code as the README says (one
``step N`` line per step, a kill mid-run, a fault-free twin beside it), each report held against what
the script itself logged and left:

- Keras 3 ``BackupAndRestore(save_freq=N)`` (experiments/examples/keras_backup.py), killed mid-epoch;
- Lightning ``ModelCheckpoint(every_n_train_steps, save_last=True)`` + ``fit(ckpt_path="last")``
  (lightning_last.py);
- Chainer ``snapshot(autoload=True)`` into a relative ``result/`` (chainer_snapshot.py).

The report's resumed step and lost steps are the script's own; a resume that ran more steps than
planned is named; the final weights (``workload.outputs``) are compared with the twin's as the test
compares them itself (its own reader of each format)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from step_logs import executed

from drills import drill
from faultdrill_cli import FULL_ONLY, campaign_copy

Weights = dict[str, np.ndarray]
EVERY = 20  # the campaigns' checkpoint interval
KILL_AT = 90


def _h5(path: Path) -> Weights:
    import h5py

    found: Weights = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda key, item: found.__setitem__(key, item[()]) if isinstance(item, h5py.Dataset) else None)
    return found


def _torch(path: Path) -> Weights:
    import torch

    return {key: value.numpy() for key, value in torch.load(path, weights_only=True).items()}


def _npz(path: Path) -> Weights:
    with np.load(path) as archive:
        return {key: archive[key] for key in archive.files}


# CI drills Chainer (7 s: outputs compared, a relative result/ beside its twin's); the others with --full.
IDIOMS = [pytest.param("example-keras-backup", "final.weights.h5", _h5, marks=FULL_ONLY),
          pytest.param("example-lightning-last", "final.pt", _torch, marks=FULL_ONLY),
          ("example-chainer-snapshot", "final.npz", _npz)]


@pytest.mark.parametrize(("campaign", "output", "read"), IDIOMS, ids=["keras", "lightning", "chainer"])
def test_a_zero_code_resume_idiom_is_reported_as_it_ran(tmp_path: Path, campaign: str, output: str,
                                                        read: Callable[[Path], Weights]) -> None:
    report = drill(campaign_copy(campaign, tmp_path), timeout=600)
    [run] = [run for run in report["runs"] if not run["is_baseline"]]
    [twin] = [run for run in report["runs"] if run["is_baseline"]]
    assert run["status"] == "completed" and twin["status"] == "completed", run
    runs = tmp_path / "work" / "runs"
    steps = executed(runs / run["run_id"] / "steps-0.log")
    failed_pid = steps[0].pid
    later = [step for step in steps if step.pid != failed_pid]
    [recovery] = run["recoveries"]
    # It resumed from its own newest checkpoint, not its twin's (which trains beside it, further on).
    assert recovery["resumed_from_step"] == later[0].step - 1, (recovery, later[0])
    reached = max(step.step for step in steps if step.pid == failed_pid and step.at <= recovery["fault_at"])
    assert recovery["resumed_from_step"] % EVERY == 0 and recovery["resumed_from_step"] <= reached, (recovery, reached)
    [fault] = run["faults"]
    assert fault["planned_step"] == KILL_AT and KILL_AT <= fault["met_step"] <= reached, (fault, reached)
    assert reached - 2 <= recovery["resumed_from_step"] + recovery["lost_steps"] <= reached, (recovery, reached)
    # More steps than planned when the resume replayed some (an epoch started over): named.
    final = max(step.step for step in later)
    assert run["final_step"] == final
    assert ("replayed" in run["progress"]) == (final > run["target_steps"]), (final, run["progress"])
    # The final weights as the test reads them, against what the report says of them.
    mine = read(runs / run["run_id"] / "work" / output)
    theirs = read(runs / twin["run_id"] / "work" / output)
    largest = max(float(np.max(np.abs(mine[key].astype(np.float64) - theirs[key].astype(np.float64))))
                  for key in mine)
    assert run["identical_to_baseline"] is (largest == 0.0), (largest, run["outputs"])
    assert run["max_abs_weight_diff"] == pytest.approx(largest), (largest, run["max_abs_weight_diff"])
    assert run["outputs"]["verdict"] == ("identical" if largest == 0.0 else "differs")
