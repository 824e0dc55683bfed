"""A Slurm without ``srun --overlap`` (before 20.11) is told at plan time (real-sites issue, item 8):
every fault's agent and the in-allocation and warm strategies' steps need it, and failed mid-drill
with "unrecognized option". Recorded ``srun --version`` output."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.slurm import version
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign, SpecError
from orchestrator.commands import CommandResult
from orchestrator.control.controller import plan_drill

pytestmark = pytest.mark.unit


def _runs(tmp_path: Path, **fields: object) -> list:
    spec = {"name": "v", "backend": "slurm", "workdir": str(tmp_path), "baseline": False,
            "workload": {"framework": "torch", "steps": 10}, **fields}
    return expand_runs(Campaign.model_validate(spec))


def _answering(monkeypatch: pytest.MonkeyPatch, printed: str) -> list[list[str]]:
    asked: list[list[str]] = []

    def srun(argv: list[str], **_: object) -> CommandResult:
        asked.append(list(argv))
        return CommandResult(args=tuple(argv), returncode=0, stdout=printed, stderr="", duration_s=0.0)

    version.site_version.cache_clear()
    monkeypatch.setattr(version, "run_command", srun)
    return asked


@pytest.mark.parametrize(("printed", "parsed"), [("slurm 20.02.7\n", (20, 2)), ("slurm-wlm 22.05.8\n", (22, 5)),
                                                 ("slurm 24.11.0-0rc1\n", (24, 11)), ("srun: what?\n", None)])
def test_the_release_is_read_from_srun_version(printed: str, parsed: tuple[int, int] | None) -> None:
    assert version.parse_version(printed) == parsed


def test_faults_and_same_job_strategies_are_refused_before_20_11(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answering(monkeypatch, "slurm 20.02.7\n")
    faults = [{"kind": "kill-rank", "after": {"fixed": 1.0}}]
    [line] = version.overlap_refusals(_runs(tmp_path, faults=faults))
    assert "Slurm 20.02" in line and "--overlap" in line and line.startswith("faults (kill-rank):"), line
    [line] = version.overlap_refusals(_runs(tmp_path, restart={"strategy": "in-allocation"}))
    assert line.startswith("restart.strategy in-allocation:") and "use resubmit or requeue" in line, line
    assert version.overlap_refusals(_runs(tmp_path)) == [], "a drill without faults on a plain resubmit needs none"
    on_the_job = [{"kind": "preempt", "after": {"fixed": 1.0}}, {"kind": "timeout", "after": {"fixed": 1.0}},
                  {"kind": "corrupt-checkpoint", "after": {"fixed": 1.0}}]
    assert version.overlap_refusals(_runs(tmp_path, faults=on_the_job)) == [], \
        "faults the controller carries out (scancel, scontrol, files) need no step on a node"
    assert asked == [["srun", "--version"]], "asked once a process"
    spec = Campaign.model_validate({"name": "v", "backend": "slurm", "workdir": str(tmp_path / "w"), "baseline": False,
                                    "workload": {"framework": "torch", "steps": 10}, "faults": faults})
    with pytest.raises(SpecError, match=r"faults \(kill-rank\): Slurm 20\.02 here has no srun --overlap"):
        plan_drill(spec)  # validate, plan and drill: before the workdir is made
    assert not (tmp_path / "w").exists()


def test_a_release_with_overlap_or_one_that_does_not_answer_refuses_nothing(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    faults = [{"kind": "kill-rank", "after": {"fixed": 1.0}}]
    _answering(monkeypatch, "slurm 20.11.9\n")
    assert version.overlap_refusals(_runs(tmp_path, faults=faults)) == []
    _answering(monkeypatch, "")
    assert version.overlap_refusals(_runs(tmp_path, faults=faults)) == []
