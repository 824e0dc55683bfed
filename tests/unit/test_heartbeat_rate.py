"""Heartbeats on a shared filesystem (real-sites issue, item 3): every rank appended a progress line
every 50 ms wherever the workdir was; on a network filesystem each append is a round trip to its
server (at 100+ ranks, thousands a second). There the ranks beat once a second, unless the spec
says (restart.heartbeat_s, at most a fifth of the hang timeout). The mount table as a login node
with an NFS home has it (recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from experiments.layout import RankJob
from experiments.runtime import mounts
from experiments.runtime.heartbeat import LOCAL_INTERVAL_S, SHARED_INTERVAL_S, interval_for
from fake_scheduler import FakeScheduler
from orchestrator.backends.base import Submission
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import SpecError, load_campaign
from orchestrator.control.controller import Controller

pytestmark = pytest.mark.unit


def _mounted_as(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:35 / {tmp_path} rw - {kind} filer:/home rw\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", table)


class Capturing(FakeScheduler):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[RankJob] = []

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        self.jobs.append(job)
        return super().submit(run, job)


def _first_job(tmp_path: Path, **restart: object) -> RankJob:
    spec = {"name": "beats", "backend": "slurm", "workdir": str(tmp_path / "work"), "baseline": False,
            "workload": {"framework": "torch", "params": 2000, "steps": 100},
            "restart": {"poll_interval_s": 0.01, **restart}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    scheduler = Capturing()
    controller = Controller(load_campaign(path), backend=scheduler)
    try:
        controller.run(observer=lambda trackers, touched: controller.stop_requested.set())
    finally:
        controller.close()
    [job] = scheduler.jobs
    return job


@pytest.mark.parametrize(("kind", "interval"), [("nfs4", SHARED_INTERVAL_S), ("lustre", SHARED_INTERVAL_S),
                                                ("ext4", LOCAL_INTERVAL_S)])
def test_the_ranks_beat_once_a_second_on_a_network_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               kind: str, interval: float) -> None:
    _mounted_as(monkeypatch, tmp_path, kind)
    assert interval_for(tmp_path / "work" / "runs") == interval
    assert _first_job(tmp_path).heartbeat_interval_s == interval


def test_the_spec_may_say_how_often_within_a_fifth_of_the_hang_timeout(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _mounted_as(monkeypatch, tmp_path, "nfs4")
    assert _first_job(tmp_path, heartbeat_s=0.2).heartbeat_interval_s == 0.2
    with pytest.raises(SpecError, match="heartbeat_s 30: at most hang_timeout_s / 5"):
        _first_job(tmp_path, heartbeat_s=30, hang_timeout_s=120)


def test_the_network_filesystems_interval_stays_within_a_fifth_of_a_short_hang_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mounted_as(monkeypatch, tmp_path, "nfs4")
    assert _first_job(tmp_path, hang_timeout_s=3.0).heartbeat_interval_s == pytest.approx(0.6)
