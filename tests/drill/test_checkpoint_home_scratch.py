"""Checkpoints on another filesystem than the run directory (real-sites issue, item 2): the
spec's ``checkpoint.directory`` (here a tmpfs, the workdir on the disk). A corrupted newest
checkpoint is moved aside within that filesystem and the run resumes from the one before, to its
last step; the checkpoints are physically there, the run directory links to them."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from drills import drill, write_spec
from experiments.layout import RunPaths, read_json_lines

pytestmark = pytest.mark.drill

SHM = Path("/dev/shm")


@pytest.fixture
def scratch() -> Path:
    if not SHM.is_dir():
        pytest.skip("no /dev/shm (a tmpfs) on this machine")
    path = SHM / f"faultdrill-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_checkpoints_on_a_scratch_filesystem_fall_back_past_a_corrupt_one_within_it(tmp_path: Path,
                                                                                   scratch: Path) -> None:
    # The corruption is the controller's, when it hears step 160; the kill is an agent's, armed on the
    # node for step 195: 1.75 s between them (0.2 s, 10 steps of 20 ms, were overtaken by a loaded
    # CI host's controller: the kill came first and the resume found 150 intact), 0.25 s before 200.
    faults = [{"kind": "corrupt-checkpoint", "after": {"at_step": 160}, "mode": "flip"},  # the newest: 150
              {"kind": "kill-rank", "after": {"at_step": 195}, "rank": 1}]
    spec = write_spec(tmp_path, faults=faults, baseline=False,
                      workload={"framework": "torch", "params": 20000, "steps": 300, "seed": 3, "batch_size": 16,
                                "step_s": 0.05},
                      checkpoint={"every_steps": 50, "keep": 3, "directory": str(scratch / "{run_id}")})
    report = drill(spec)
    [run] = [run for run in report["runs"] if run["faults"]]
    assert run["status"] == "completed" and run["final_step"] == 300, run["attempts"]
    [recovery] = run["recoveries"]
    assert recovery["fallback_from_step"] == 150 and recovery["resumed_from_step"] == 100, (recovery, run["faults"])
    paths = RunPaths(tmp_path / "work" / "runs" / run["run_id"])
    [home] = (scratch / run["run_id"]).iterdir()  # the drill's own folder
    assert paths.checkpoints.is_symlink() and paths.checkpoints.resolve() == home.resolve()
    assert home.stat().st_dev != paths.root.stat().st_dev, "the test's point: another filesystem"
    [aside] = read_json_lines(home / "quarantine" / "index.jsonl")
    assert aside["from"].endswith("step-00000150") and Path(aside["to"]).resolve().is_relative_to(home.resolve())
    assert sorted(path.name for path in home.iterdir() if path.name.startswith("step-"))[-1] == "step-00000300"


def test_a_ledger_kept_on_the_login_nodes_local_disk_goes_with_the_runs_when_the_drill_ends(tmp_path: Path) -> None:
    """Issue 22 item 3: ``ledger_dir`` (a workdir on NFS keeps its ledger on local disk): while the
    drill runs the workdir points to it; at the end the ledger is in the workdir, the pointer and the
    local copy gone, and the report reads it there."""
    from orchestrator.record.ledger import Ledger
    from orchestrator.record.ledger_home import LEDGER_NAME, POINTER_NAME

    local = tmp_path / "local"
    spec = write_spec(tmp_path, baseline=False, ledger_dir=str(local),
                      faults=[{"kind": "kill-rank", "after": {"at_step": 60}, "rank": 1}])
    report = drill(spec)
    [run] = report["runs"]
    assert run["status"] == "completed" and len(run["attempts"]) == 2, run["attempts"]
    workdir = tmp_path / "work"
    assert (workdir / LEDGER_NAME).exists() and not (workdir / POINTER_NAME).exists()
    assert local.is_dir() and list(local.iterdir()) == [], "the local copy removed once brought home"
    ledger = Ledger(workdir / LEDGER_NAME)
    try:
        assert ledger.meta("finished") is not None and len(ledger.attempts(run["run_id"])) == 2
    finally:
        ledger.close()
