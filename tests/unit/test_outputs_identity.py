"""Issue 27, item 3: identity for the user's own script. The files it leaves (workload.outputs)
against its twin's: identical, differs (with the largest difference and the tensor that has it),
missing; and the report never says nothing when identity was not checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from experiments.layout import read_attempt_events
from orchestrator.record import outputs
from orchestrator.record.outputs import DIFFERS, IDENTICAL, MISSING, compare_outputs, matched_outputs


def _torch_save(path: Path, weights: dict[str, np.ndarray], step: int) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {name: torch.tensor(value) for name, value in weights.items()}, "step": step}, path)


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "run", tmp_path / "twin"


WEIGHTS = {"fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "fc.bias": np.zeros(2, dtype=np.float32)}


@pytest.mark.drill  # imports torch
def test_torch_files_that_hold_the_same_tensors_are_identical(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    _torch_save(run / "model.pt", WEIGHTS, 100)
    _torch_save(twin / "model.pt", WEIGHTS, 100)
    verdict = compare_outputs(run, twin, ["*.pt"])
    assert verdict.verdict == IDENTICAL and verdict.max_abs_diff == 0.0
    assert verdict.files[0].how == "bytes (equal)"  # equal bytes: not read as tensors at all


@pytest.mark.drill  # imports torch
def test_a_difference_names_its_largest_value_and_tensor(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    _torch_save(run / "out" / "model.pt", WEIGHTS, 100)
    _torch_save(twin / "out" / "model.pt", {**WEIGHTS, "fc.bias": np.array([0.0, 0.011], dtype=np.float32)}, 100)
    verdict = compare_outputs(run, twin, ["out/*.pt"])
    assert verdict.verdict == DIFFERS and verdict.max_abs_diff == pytest.approx(0.011)
    assert verdict.files[0].worst == "model.fc.bias" and verdict.files[0].name == "out/model.pt"


def test_numpy_and_other_files_and_missing_ones(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    for side in sides:
        side.mkdir()
        np.savez(side / "w.npz", a=np.ones(3))
        (side / "log.txt").write_text("same\n")
    (run / "extra.bin.txt").write_text("only here")
    (twin / "log.txt").write_text("other\n")
    verdict = compare_outputs(run, twin, ["*.npz", "*.txt"])
    by_name = {f.name: f for f in verdict.files}
    assert by_name["w.npz"].verdict == IDENTICAL and by_name["w.npz"].how == "bytes (equal)"
    assert by_name["log.txt"].verdict == DIFFERS and by_name["log.txt"].how == "bytes"
    assert by_name["extra.bin.txt"].verdict == MISSING and verdict.verdict == MISSING
    assert compare_outputs(run, twin, ["nothing-*"]).verdict == MISSING


def test_nan_where_both_have_it_is_no_difference_one_sided_nan_is(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    for side, values in ((run, [np.nan, 1.0]), (twin, [np.nan, 1.0])):
        side.mkdir()
        np.save(side / "a.npy", np.array(values))
    assert compare_outputs(run, twin, ["a.npy"]).verdict == IDENTICAL
    np.save(twin / "a.npy", np.array([0.0, 1.0]))
    assert compare_outputs(run, twin, ["a.npy"]).max_abs_diff == float("inf")


@pytest.mark.drill  # imports torch
def test_a_file_that_is_not_what_its_suffix_says_is_compared_by_its_bytes(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    for side in sides:
        side.mkdir()
        (side / "weights.pt").write_bytes(b"not a torch file")
    [file] = compare_outputs(run, twin, ["*.pt"]).files
    assert file.verdict == IDENTICAL and file.how.startswith("bytes (")


def test_matched_outputs_are_named_relative_to_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "last.ckpt").write_text("x")
    assert list(matched_outputs(tmp_path, ["a/**/*.ckpt"])) == ["a/b/last.ckpt"]


def _report_of(tmp_path: Path, outputs: list[str]) -> dict[str, object]:
    """A zero-code run and its twin through the ledger and the report (no drill: the rows written as
    the controller writes them)."""
    from orchestrator.campaign.runs import expand_runs
    from orchestrator.campaign.spec import parse_campaign
    from orchestrator.record.ledger import Ledger, RunRow
    from orchestrator.record.measure import record_determinism
    from orchestrator.report.document import build_report

    raw = {"name": "id", "backend": "local", "workdir": str(tmp_path / "work"), "baseline": True,
           "workload": {"command": ["python", "t.py"], "framework": "torch", "steps": 10, "outputs": outputs,
                        "progress": {"log": r"step (\d+)"}},
           "faults": [{"kind": "kill-rank", "after": {"at_step": 5}}]}
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    (tmp_path / "work").mkdir()
    ledger = Ledger(tmp_path / "work" / "ledger.sqlite")
    for run in runs:
        ledger.add_run(RunRow(run_id=run.run_id, framework="torch", ranks=1, nodes=1, strategy="resubmit",
                              target_steps=10, baseline_of=run.baseline_of, twin=run.twin, status="completed",
                              config=json.dumps(run.campaign.model_dump(mode="json"))))
        assert run.command is not None
        Path(run.command.cwd).mkdir(parents=True)
        np.savez(Path(run.command.cwd) / "final.npz", **{**WEIGHTS, "fc.bias": np.array([0.0, 0.5 if run.twin else 0.0])})
    record_determinism(ledger, runs)
    ledger.close()
    document = build_report(tmp_path / "work")
    return next(run for run in document["runs"] if not run["is_baseline"])


def test_the_report_says_how_the_outputs_compare_or_that_identity_was_not_checked(tmp_path: Path) -> None:
    (tmp_path / "checked").mkdir()
    run = _report_of(tmp_path / "checked", ["final.npz"])
    assert run["identical_to_baseline"] is False and run["max_abs_weight_diff"] == pytest.approx(0.5)
    assert run["outputs"]["verdict"] == DIFFERS and run["outputs"]["files"][0]["worst"] == "fc.bias"
    (tmp_path / "unchecked").mkdir()
    unchecked = _report_of(tmp_path / "unchecked", [])
    assert unchecked["identical_to_baseline"] is None
    assert "identity not checked" in unchecked["outputs"]["note"] and "workload.outputs" in unchecked["outputs"]["note"]


def test_a_resume_that_replayed_steps_is_named(tmp_path: Path) -> None:
    """Keras 3's BackupAndRestore restores the weights and restarts the epoch at its first batch: the
    script's own step count goes past its last step. The report says so, beside the identity."""
    from orchestrator.record.ledger import RunRow
    from orchestrator.report.document import progress_figures
    from orchestrator.report.tables import _identity

    config = json.dumps({"workload": {"command": ["python", "k.py"], "progress": {"log": "step (\\d+)"}}})
    row = RunRow(run_id="r000", framework="tensorflow", ranks=1, nodes=1, strategy="resubmit", target_steps=400,
                 baseline_of=None, config=config, status="completed", final_step=450)
    figures = progress_figures(row)
    assert "went past its last step (450 of 400)" in figures["replayed"]
    run = {"is_baseline": False, "identical_to_baseline": False, "progress": figures,
           "outputs": {"verdict": DIFFERS, "max_abs_diff": 0.011}}
    assert _identity(run) == "differs (max 0.011); replayed steps"
    assert "replayed" not in progress_figures(RunRow(**{**row.__dict__, "final_step": 400}))


@pytest.mark.parametrize(("newest_file", "first_logged", "resumed", "named"), [
    (100, 101, 100, False),
    (100, 51, 50, True),  # it loaded an older file: its log is taken
    (100, 100, 99, True),  # it ran step 100 again
    (200, 210, 200, False),  # review: a script that logs every 10 steps resumed right from 200
    (0, 0, 0, False),  # review: no file yet (0), the script logs from step 0
])
def test_a_resume_the_log_says_was_not_from_the_newest_checkpoint_file_is_named(
        tmp_path: Path, newest_file: int, first_logged: int, resumed: int, named: bool) -> None:
    """Log mode with the script's checkpoint files known: its first step logged after a restart
    should follow its newest file; one that does not (it loaded an older file, or none) is taken
    from the log and named."""
    from experiments.layout import EVENT_CHECKPOINT_LOADED, RankJob, RunPaths, WorkloadSpec, first_event
    from experiments.runtime.command import InferredProgress
    from experiments.runtime.events import EventLog
    from experiments.runtime.heartbeat import HeartbeatWriter
    from orchestrator.record.ledger import RunRow
    from orchestrator.report.document import progress_figures
    from orchestrator.report.tables import _identity

    paths = RunPaths(tmp_path / "runs" / "r000")
    job = RankJob(run_id="r000", run_dir=str(paths.root), attempt=1, workload=WorkloadSpec(steps=400),
                  checkpoint_every=50, checkpoint_keep=2)
    progress = InferredProgress(job, EventLog(paths.events_file(1), enabled=True),
                                HeartbeatWriter(paths.heartbeat_file(1, 0), 1, 0.05), resumed_from=newest_file,
                                logged=True)
    progress.saw(first_logged)
    loaded = first_event(read_attempt_events(paths, 1), EVENT_CHECKPOINT_LOADED)
    assert loaded is not None and loaded.number("step", -1) == resumed
    assert bool(loaded.fields.get("resume_mismatch")) is named
    config = json.dumps({"workload": {"command": ["python", "t.py"], "progress": {"log": "step (\\d+)"}}})
    row = RunRow(run_id="r000", framework="torch", ranks=1, nodes=1, strategy="resubmit", target_steps=400,
                 baseline_of=None, config=config, status="completed", final_step=400)
    figures = progress_figures(row, paths)
    if named:
        assert figures["resume_mismatch"] == {"1": f"its newest checkpoint file was step {newest_file}, but its "
                                                     f"first step logged was {first_logged}: it resumed from step {resumed}"}
        assert _identity({"is_baseline": False, "identical_to_baseline": None, "progress": figures}).endswith(
            "resumed from an older step than its newest checkpoint file")
    else:
        assert "resume_mismatch" not in figures


def test_equal_infinities_big_integers_and_plain_values_compare_as_they_are(sides: tuple[Path, Path]) -> None:
    """Lightning's ModelCheckpoint keeps kth_value = inf: equal on both sides is no difference;
    int64 beyond 2**53 differs by 1, not 0; a string that differs is a difference."""
    run, twin = sides
    for side, big, note in ((run, 2**53, "epoch 1.0"), (twin, 2**53 + 1, "epoch 1.5")):
        side.mkdir()
        np.savez(side / "a.npz", kth=np.array([np.inf, -np.inf]))
        np.savez(side / "b.npz", count=np.array([big], dtype=np.int64))
        np.savez(side / "c.npz", note=np.array(note))
    by_name = {f.name: f for f in compare_outputs(run, twin, ["*.npz"]).files}
    assert by_name["a.npz"].verdict == IDENTICAL and by_name["a.npz"].max_abs_diff == 0.0
    assert by_name["b.npz"].max_abs_diff == 1.0
    assert by_name["c.npz"].verdict == DIFFERS


def test_a_file_that_differs_only_as_bytes_gives_no_size_of_difference(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    for side, text in ((run, "x"), (twin, "y")):
        side.mkdir()
        np.savez(side / "w.npz", a=np.ones(2))
        (side / "notes.txt").write_text(text)
    verdict = compare_outputs(run, twin, ["w.npz", "notes.txt"])
    assert verdict.verdict == DIFFERS and verdict.max_abs_diff is None


def test_a_link_out_of_the_working_directory_is_not_an_output(sides: tuple[Path, Path], tmp_path: Path) -> None:
    run, twin = sides
    (tmp_path / "elsewhere.txt").write_text("not the run's")
    for side in sides:
        side.mkdir()
        (side / "out.txt").symlink_to(tmp_path / "elsewhere.txt")
    assert matched_outputs(run, ["*.txt"]) == {}


@pytest.mark.parametrize(("pattern", "expected"), [
    ("", "is empty"), (".", "is empty"), ("/abs/model.pt", "is absolute"), ("../twin/model.pt", "leaves the script's"),
    ("{run_dir}/model.pt", "{run_dir} differs between a run and its twin"), ("m-{run_id}.pt", "{run_id} differs"),
])
def test_outputs_that_cannot_name_the_same_files_for_the_twin_are_refused(tmp_path: Path, pattern: str,
                                                                          expected: str) -> None:
    from orchestrator.campaign.spec import SpecError, parse_campaign

    raw = {"name": "o", "backend": "local", "workdir": str(tmp_path / "work"),
           "workload": {"command": ["python", "t.py"], "framework": "torch", "outputs": [pattern],
                        "progress": {"log": r"step (\d+)"}}}
    with pytest.raises(SpecError, match=re.escape(expected)):
        parse_campaign(raw, base_dir=tmp_path)


def test_the_same_tensors_in_other_bytes_are_identical_by_value(sides: tuple[Path, Path]) -> None:
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    np.savez(run / "w.npz", a=np.arange(10.0))
    np.savez_compressed(twin / "w.npz", a=np.arange(10.0))
    [file] = compare_outputs(run, twin, ["*.npz"]).files
    assert file.verdict == IDENTICAL and file.how == "tensors"


def test_a_large_tensor_is_compared_a_chunk_at_a_time_to_the_same_answer(sides: tuple[Path, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    values = np.random.default_rng(1).standard_normal((50, 41)).astype(np.float32)
    other = values.copy()
    other[49, 40] += 0.5  # in the last, partial chunk
    other[3, 2] = np.nan
    np.savez(run / "w.npz", a=values)
    np.savez(twin / "w.npz", a=other)
    whole = compare_outputs(run, twin, ["*.npz"]).files[0]
    monkeypatch.setattr(outputs, "DIFF_CHUNK", 97)
    chunked = compare_outputs(run, twin, ["*.npz"]).files[0]
    assert whole.max_abs_diff == chunked.max_abs_diff == float("inf")  # the one-sided NaN
    other[3, 2] = values[3, 2]
    np.savez(twin / "w.npz", a=other)
    assert compare_outputs(run, twin, ["*.npz"]).files[0].max_abs_diff == pytest.approx(0.5)


def test_a_file_too_large_to_read_as_tensors_is_compared_by_its_bytes(sides: tuple[Path, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    np.savez(run / "w.npz", a=np.zeros(1000))
    np.savez(twin / "w.npz", a=np.ones(1000))
    monkeypatch.setattr(outputs, "TENSOR_FILE_BYTES_AT_MOST", 100)
    [file] = compare_outputs(run, twin, ["*.npz"]).files
    assert file.verdict == DIFFERS and file.max_abs_diff is None and "not read as tensors" in file.how


def test_a_compressed_file_is_measured_by_what_it_unpacks_to(sides: tuple[Path, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: 128 KiB of savez_compressed unpacked to 128 MiB under a limit that read the disk size."""
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    np.savez_compressed(run / "w.npz", a=np.zeros(100_000))
    np.savez_compressed(twin / "w.npz", a=np.ones(100_000))
    assert (run / "w.npz").stat().st_size < 100_000
    monkeypatch.setattr(outputs, "TENSOR_FILE_BYTES_AT_MOST", 100_000)
    [file] = compare_outputs(run, twin, ["*.npz"]).files
    assert file.verdict == DIFFERS and "not read as tensors" in file.how


def test_each_file_is_hashed_once(sides: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    (run / "w.npz").write_bytes(b"not a zip")
    (twin / "w.npz").write_bytes(b"not a zap")  # the same size: only a hash tells them apart
    hashed: list[str] = []
    real = outputs._sha256
    monkeypatch.setattr(outputs, "_sha256", lambda path: hashed.append(path.parent.name) or real(path))
    [file] = compare_outputs(run, twin, ["*.npz"]).files
    assert file.verdict == DIFFERS and sorted(hashed) == ["run", "twin"], hashed


def test_files_of_different_sizes_differ_without_being_read(sides: tuple[Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-review: a pair whose sizes differ was hashed in full before its tensors were read."""
    run, twin = sides
    run.mkdir()
    twin.mkdir()
    (run / "w.txt").write_bytes(b"short")  # a suffix with no tensor reader: its bytes alone say
    (twin / "w.txt").write_bytes(b"longer bytes")
    monkeypatch.setattr(outputs, "_sha256", lambda path: pytest.fail(f"{path} was hashed"))
    [file] = compare_outputs(run, twin, ["*.txt"]).files
    assert file.verdict == DIFFERS


@pytest.mark.drill  # h5py's import starts a process
def test_a_compressed_hdf5_file_is_measured_by_its_datasets(sides: tuple[Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-review: a gzip-compressed .h5 of 36 KB read as 32 MiB under a limit that took its disk size."""
    import h5py

    run, twin = sides
    run.mkdir()
    twin.mkdir()
    for side, value in ((run, 0.0), (twin, 1.0)):
        with h5py.File(side / "w.weights.h5", "w") as file:
            file.create_dataset("layer/kernel", data=np.full(100_000, value), compression="gzip")
    assert (run / "w.weights.h5").stat().st_size < 100_000
    monkeypatch.setattr(outputs, "TENSOR_FILE_BYTES_AT_MOST", 100_000)
    [file] = compare_outputs(run, twin, ["*.h5"]).files
    assert file.verdict == DIFFERS and "not read as tensors" in file.how
