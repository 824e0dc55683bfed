"""The workdir is the user's (security issue 28, item 2): created 0700, the drill's files written
under a matching umask; one that exists and belongs to another user, or that others could write, is
refused before anything in it is read (its owed cluster actions are argv lists the controller runs,
its controller.json names a pid that `stop` signals, its pickles are loaded)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.campaign.spec import Campaign, SpecError, parse_campaign
from orchestrator.control.detach import LOCK_NAME, ControllerLock
from orchestrator.control.workdir import UnsafeWorkdir, check_workdir, claim_workdir, prepare_workdir
from orchestrator.faults.job_control import MENDS_NAME

pytestmark = pytest.mark.unit

STRANGER_UID = 54321  # no such user needed: a uid that is not the drill's


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def _campaign(workdir: Path, **fields: object) -> Campaign:
    return Campaign.model_validate({"name": "safety", "workdir": str(workdir), **fields})


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_workdir_is_private_and_so_is_every_file_the_drill_writes(tmp_path: Path) -> None:
    campaign = _campaign(tmp_path / "work")
    claim_workdir(campaign)
    assert _mode(campaign.workdir) == 0o700
    written = campaign.workdir / "ledger.sqlite"
    written.write_text("x")
    assert _mode(written) == 0o600
    with ControllerLock(campaign.workdir):
        assert _mode(campaign.workdir / LOCK_NAME) == 0o600


def test_a_team_workdir_mode_is_kept_and_never_writable_by_others(tmp_path: Path) -> None:
    claim_workdir(_campaign(tmp_path / "team", workdir_mode="0750"))
    assert _mode(tmp_path / "team") == 0o750
    with pytest.raises(SpecError, match="workdir_mode.*lets every user write the drill's files; valid: an octal mode"):
        parse_campaign({"name": "open", "workdir": str(tmp_path / "open"), "workdir_mode": "0777"}, base_dir=tmp_path)
    assert not (tmp_path / "open").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_a_workdir_another_user_made_is_refused_before_anything_in_it_is_read(tmp_path: Path) -> None:
    """The stranger's workdir holds an owed 'mend' that would run as the drill's user."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    marker = tmp_path / "ran"
    (workdir / MENDS_NAME).write_text(f'[{{"argv": ["touch", "{marker}"], "reason": "owed"}}]')
    os.chown(workdir, STRANGER_UID, -1)
    with pytest.raises(UnsafeWorkdir, match=f"belongs to uid {STRANGER_UID}, not to you"):
        prepare_workdir(_campaign(workdir))
    with pytest.raises(UnsafeWorkdir):
        check_workdir(workdir)
    assert not marker.exists()


@pytest.mark.parametrize("mode,workdir_mode,refused", [(0o770, "0700", "group"), (0o707, "0770", "others"),
                                                        (0o1777, "0700", "group"), (0o770, "0770", None)])
def test_a_workdir_writable_by_more_than_its_mode_allows_is_refused(tmp_path: Path, mode: int, workdir_mode: str,
                                                                     refused: str | None) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    os.chmod(workdir, mode)
    if refused is None:
        claim_workdir(_campaign(workdir, workdir_mode=workdir_mode))
        return
    with pytest.raises(UnsafeWorkdir, match=f"writable by {refused} .*chmod go-w"):
        claim_workdir(_campaign(workdir, workdir_mode=workdir_mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="a file another user's needs root")
def test_a_strangers_file_left_in_a_workdir_tightened_since_is_refused(tmp_path: Path) -> None:
    """Review of item 2: the workdir was open (0777) and refused; a stranger planted an owed
    'mend' meanwhile; the user ran the chmod the refusal asks for. The workdir passed, and the
    controller ran the stranger's argv. What lies in the workdir is checked too."""
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    marker = tmp_path / "ran"
    planted = workdir / MENDS_NAME
    planted.write_text(f'[{{"argv": ["touch", "{marker}"], "reason": "owed"}}]')
    os.chown(planted, STRANGER_UID, -1)
    with pytest.raises(UnsafeWorkdir, match=f"{MENDS_NAME} belongs to uid {STRANGER_UID}"):
        check_workdir(workdir)
    with pytest.raises(UnsafeWorkdir):
        prepare_workdir(_campaign(workdir))
    os.chown(planted, os.geteuid(), -1)
    os.chmod(planted, 0o666)  # the user's own, but anyone may rewrite it
    with pytest.raises(UnsafeWorkdir, match="writable by others"):
        check_workdir(workdir)
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file another user's needs root")
def test_status_checks_the_workdir_before_it_opens_anything_there(tmp_path: Path) -> None:
    """Review of item 2: `status` (and `drill --detach`) opened the controller's lock file before
    any check, following a stranger's symlink."""
    from orchestrator.cli import _status
    from orchestrator.record.ledger import Ledger

    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    Ledger.in_workdir(workdir).close()
    target = tmp_path / "created-through-the-link"
    (workdir / LOCK_NAME).symlink_to(target)
    os.lchown(workdir / LOCK_NAME, STRANGER_UID, -1)
    with pytest.raises(UnsafeWorkdir, match=f"belongs to uid {STRANGER_UID}"):
        _status(workdir, "json")
    assert not target.exists()


def test_cancel_holds_the_workdir_to_the_specs_own_mode(tmp_path: Path) -> None:
    """Review of item 2: `cancel` checked every workdir against 0770 (group-writable passed where
    the spec said 0700) and wrote under the shell's umask."""
    from orchestrator.cli import _cancel
    from orchestrator.record.ledger import Ledger

    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    ledger = Ledger.in_workdir(workdir)
    ledger.set_meta("spec", {"name": "safety", "workdir": str(workdir), "workdir_mode": "0700"})
    ledger.close()
    os.chmod(workdir, 0o770)
    with pytest.raises(UnsafeWorkdir, match="writable by group"):
        _cancel(workdir)


def test_a_workdir_reached_through_a_symlink_is_used_by_its_real_path(tmp_path: Path) -> None:
    """Re-review: the workdir was checked through its path, then used through it: a stranger's symlink
    in a sticky scratch directory, pointing at a directory of the user's, passed the check and was
    repointed after it. The spec's workdir is its real path from the start."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (scratch / "work").symlink_to(mine)
    campaign = parse_campaign({"name": "linked", "workdir": str(scratch / "work")}, base_dir=tmp_path)
    assert campaign.workdir == mine
    assert check_workdir(scratch / "work") == mine


@pytest.mark.parametrize("parent_mode,workdir_mode,refused", [
    (0o777, "0700", "others"), (0o770, "0700", "group"), (0o770, "0770", None), (0o1777, "0700", None)])
def test_a_workdir_in_a_directory_others_may_write_is_refused(tmp_path: Path, parent_mode: int, workdir_mode: str,
                                                              refused: str | None) -> None:
    """Re-review: whoever may write a directory above the workdir may rename the workdir away and put
    one of theirs in its place (a sticky one keeps each entry its owner's)."""
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, parent_mode)
    campaign = _campaign(parent / "work", workdir_mode=workdir_mode)
    if refused is None:
        claim_workdir(campaign)
        return
    with pytest.raises(UnsafeWorkdir, match=f"{parent}, above the workdir, is writable by {refused}.*move the workdir away"):
        claim_workdir(campaign)
    assert not (parent / "work").exists(), "the workdir was made before the refusal"


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory another user's needs root")
def test_a_workdir_under_a_strangers_directory_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, STRANGER_UID, -1)
    with pytest.raises(UnsafeWorkdir, match=f"{parent}, above the workdir, belongs to uid {STRANGER_UID}"):
        claim_workdir(_campaign(parent / "work"))
