"""The torch workload and the runner in one process (world size 1): fast resume checks."""

import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from experiments.layout import (  # noqa: E402
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    EVENT_FIRST_STEP,
    EVENT_FRAMEWORK_READY,
    EVENT_PROCESS_START,
    RankJob,
    RunPaths,
    WorkloadSpec,
    attempt_event_lines,
    read_json_lines,
)
from experiments.runner import RunnerOptions, run_training  # noqa: E402
from experiments.runtime.distenv import DistEnv  # noqa: E402
from experiments.workloads import get_workload  # noqa: E402
from experiments.workloads.synthetic import mixed_seed  # noqa: E402
from experiments.workloads.synthetic import mlp_param_count as count_params  # noqa: E402
from experiments.workloads.synthetic import mlp_width as hidden_width  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_single(run_dir: Path, steps: int, attempt: int = 0, every: int = 10, asynchronous: bool = True) -> str:
    job = RankJob(run_id="t", run_dir=str(run_dir), attempt=attempt,
                  workload=WorkloadSpec(params=3000, steps=steps, batch_size=8),
                  checkpoint_every=every, checkpoint_keep=2, heartbeat_interval_s=0.0)
    env = DistEnv.from_environ({"FAULTDRILL_MASTER_PORT": str(free_port())}, hostname="test")
    outcome = run_training(job, env, get_workload("torch"), started_at=0.0,
                           options=RunnerOptions(async_persist=asynchronous))
    return outcome.digest


@pytest.mark.parametrize("params", [100_000, 1_000_000, 10_000_000])
def test_hidden_width_matches_requested_size(params: int) -> None:
    # Widths are whole numbers: adjacent ones differ by ~2*width parameters (0.6 % at 100k).
    assert abs(count_params(hidden_width(params)) - params) / params < 0.005


def test_data_seed_depends_on_step_and_rank() -> None:
    seeds = {mixed_seed(0, 0, step, rank) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200
    assert mixed_seed(1, 0, 5, 0) == mixed_seed(1, 0, 5, 0)


def test_resume_reproduces_uninterrupted_digest(tmp_path: Path) -> None:
    straight = run_single(tmp_path / "straight", steps=30)
    # An attempt that stops after step 17 (last checkpoint: 10); the next attempt resumes there.
    run_single(tmp_path / "broken", steps=17)
    resumed = run_single(tmp_path / "broken", steps=30, attempt=1, asynchronous=False)
    assert resumed == straight

    paths = RunPaths(tmp_path / "broken")
    events = attempt_event_lines(paths, 1)
    assert [e["event"] for e in events] == [EVENT_PROCESS_START, EVENT_FRAMEWORK_READY,
                                           EVENT_CHECKPOINT_LOADED, EVENT_FIRST_STEP, EVENT_COMPLETED]
    assert events[2]["step"] == 10 and events[3]["step"] == 11
    assert read_json_lines(paths.final)[0]["digest"] == straight
    losses = [line for line in read_json_lines(paths.loss_log) if line["attempt"] == 1]
    assert [line["step"] for line in losses] == list(range(11, 31))
    beats = read_json_lines(paths.heartbeat_file(1, 0))
    assert beats[-1] == {"attempt": 1, "step": 30, "time": beats[-1]["time"]}
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["step-00000020", "step-00000030"]


def test_cold_start_when_no_checkpoint(tmp_path: Path) -> None:
    run_single(tmp_path, steps=5, every=0)
    events = attempt_event_lines(RunPaths(tmp_path), 0)
    loaded = next(e for e in events if e["event"] == EVENT_CHECKPOINT_LOADED)
    assert loaded["step"] == 0
    assert not RunPaths(tmp_path).checkpoints.exists()


def test_torch_saves_without_its_unchecked_crc_and_the_state_loads_the_same(tmp_path: Path) -> None:
    """torch.load never checks a record's CRC-32 (the manifest's hash is the check), so the store's
    torch.save skips computing it; the setting is torch's global one and is put back."""
    import zipfile

    from torch.utils.serialization import config

    from experiments.runtime import torch_state

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 64)).sum().backward()
    optimizer.step()
    torch_state.save(tmp_path, model, optimizer, rank=0, step=3)
    assert config.save.compute_crc32 is True
    with zipfile.ZipFile(tmp_path / torch_state.MODEL_FILE) as archive:
        records = [info for info in archive.infolist() if "/data/" in info.filename]
    assert records and all(info.CRC == 0 for info in records)
    twin = torch.nn.Linear(64, 64)
    state = torch_state.load(tmp_path, twin, torch.optim.Adam(twin.parameters()), rank=0, step=3)
    assert state["step"] == 3 and all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True))


def test_overlapping_saves_put_torchs_crc_setting_back() -> None:
    """Review of goal 3: saves on two threads that overlap (the first ends while the second runs)
    left torch's CRC off for the whole process; counted, it comes back when the last ends."""
    from torch.utils.serialization import config

    from experiments.runtime.torch_state import _without_crc

    first, second = _without_crc(), _without_crc()
    first.__enter__()
    second.__enter__()
    assert config.save.compute_crc32 is False
    first.__exit__(None, None, None)
    assert config.save.compute_crc32 is False  # the second save still runs
    second.__exit__(None, None, None)
    assert config.save.compute_crc32 is True

