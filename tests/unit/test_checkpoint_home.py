"""``checkpoint.directory`` (real-sites issue, item 2): the spec says where each run's checkpoints
go; each run needs its own ({run_id}); a relative path is the spec folder's; what cannot be made is
said before anything is; the run directory's checkpoints/ links there, a restarted controller keeps
the link, and a spec changed under an unfinished drill is refused, not followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.control.checkpoint_home import checkpoint_home_refusals, link_checkpoint_homes

pytestmark = pytest.mark.unit


def _campaign(tmp_path: Path, directory: str, **extra: object):
    return parse_campaign({"name": "ck", "backend": "local", "workdir": str(tmp_path / "work"),
                           "workload": {"framework": "torch", "steps": 10},
                           "checkpoint": {"every_steps": 5, "directory": directory}, **extra}, base_dir=tmp_path)


def test_each_run_needs_a_directory_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"put \{run_id\} in it"):
        _campaign(tmp_path, "/scratch/drill")
    with pytest.raises(SpecError, match=r"only \{run_id\} may be named"):
        _campaign(tmp_path, "/scratch/{user}/{run_id}")


def test_each_run_fills_in_its_id_and_each_drill_keeps_a_folder_of_its_own(tmp_path: Path) -> None:
    runs = expand_runs(_campaign(tmp_path, str(tmp_path / "scratch" / "{run_id}"), baseline=True))
    assert sorted(str(run.checkpoint_home("d1")) for run in runs) == sorted(
        [str(tmp_path / "scratch" / "r000" / "d1"), str(tmp_path / "scratch" / "r000-baseline" / "d1")])
    with pytest.raises(SpecError, match="an absolute path"):  # in a sweep point too: nothing to anchor it to
        _campaign(tmp_path, "scratch/{run_id}")


def test_a_later_drill_of_the_same_spec_never_resumes_from_an_earlier_drills_checkpoints(tmp_path: Path) -> None:
    """The review's finding: the folder was the run id's alone; a finished drill archived and the spec
    drilled again linked to the old checkpoints, and the new run resumed from them."""
    [run] = expand_runs(_campaign(tmp_path, str(tmp_path / "scratch" / "{run_id}")))
    link_checkpoint_homes([run], "drill-1")
    (run.paths.checkpoints / "step-00000010").mkdir()
    run.paths.checkpoints.unlink()  # the workdir archived: a fresh run directory, a new drill
    link_checkpoint_homes([run], "drill-2")
    assert list(run.paths.checkpoints.iterdir()) == []


def test_what_cannot_be_made_is_said_before_anything_is(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    runs = expand_runs(_campaign(tmp_path, str(tmp_path / "afile" / "{run_id}")))
    [problem] = checkpoint_home_refusals(runs)
    assert "afile is not a directory you may write" in problem
    runs = expand_runs(_campaign(tmp_path, str(tmp_path / "work" / "runs" / "{run_id}" / "ck")))
    [problem] = checkpoint_home_refusals(runs)
    assert "inside the run directory" in problem


def test_the_run_directory_links_to_its_checkpoints_and_a_changed_spec_is_refused(tmp_path: Path) -> None:
    [run] = expand_runs(_campaign(tmp_path, str(tmp_path / "scratch" / "{run_id}")))
    link_checkpoint_homes([run], "d1")
    link_checkpoint_homes([run], "d1")  # a restarted controller: the link kept
    home = tmp_path / "scratch" / "r000" / "d1"
    assert run.paths.checkpoints.is_symlink() and run.paths.checkpoints.resolve() == home
    assert home.stat().st_mode & 0o777 == 0o700 and home.parent.stat().st_mode & 0o777 == 0o700
    [moved] = expand_runs(_campaign(tmp_path, str(tmp_path / "elsewhere" / "{run_id}")))
    with pytest.raises(SpecError, match="the spec changed under an unfinished drill"):
        link_checkpoint_homes([moved], "d1")
    (tmp_path / "other").mkdir()
    [plain] = expand_runs(_campaign(tmp_path / "other", str(tmp_path / "s2" / "{run_id}")))
    (plain.paths.checkpoints / "step-00000005").mkdir(parents=True)  # checkpoints a spec without it wrote
    with pytest.raises(SpecError, match="already holds checkpoints"):
        link_checkpoint_homes([plain], "d1")


def test_a_checkpoint_directory_others_may_write_under_is_refused(tmp_path: Path) -> None:
    """The workdir's rule, for what the ranks load: nobody else may rename the folder away."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky
    [run] = expand_runs(_campaign(tmp_path, str(shared / "{run_id}")))
    with pytest.raises(SpecError, match="checkpoint.directory: .*writable by others"):
        link_checkpoint_homes([run], "d1")


def test_a_project_scratch_directory_the_group_may_write_is_refused_at_plan_unless_the_spec_trusts_the_group(
        tmp_path: Path) -> None:
    """Review of issue 22: /scratch/<project> (mode 2775) was refused only when the controller started,
    after the ledger was made (a corrected spec was then 'another spec'), always, whatever
    workdir_mode trusted; and the message spoke of the workdir."""
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)
    runs = expand_runs(_campaign(tmp_path, str(project / "{run_id}")))
    [problem] = checkpoint_home_refusals(runs)
    assert f"{project}, above checkpoint.directory, is writable by group" in problem, problem
    assert "workdir_mode 0770" in problem, problem
    assert not (tmp_path / "work").exists(), "said at plan: nothing made"
    trusted = expand_runs(_campaign(tmp_path, str(project / "{run_id}"), workdir_mode="0770"))
    assert checkpoint_home_refusals(trusted) == []
    link_checkpoint_homes(trusted[:1], "d1")
    assert trusted[0].paths.checkpoints.resolve() == project / "r000" / "d1"


def test_a_checkpoint_directory_through_a_link_is_checked_at_plan_by_its_real_path(tmp_path: Path) -> None:
    """Second review of issue 22: ~/scratch linked to a directory others may write passed plan (its
    ancestors were read as written) and was refused at the drill's start, naming the workdir."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "scratch").symlink_to(shared)
    runs = expand_runs(_campaign(tmp_path, str(tmp_path / "mine" / "scratch" / "ck" / "{run_id}")))
    [problem] = checkpoint_home_refusals(runs)
    assert f"{shared}, above checkpoint.directory, is writable by others" in problem, problem
