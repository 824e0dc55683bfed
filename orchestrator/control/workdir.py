"""A campaign's workdir: start fresh, resume an interrupted drill, or archive a finished one."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from orchestrator.campaign.spec import Campaign, SpecError
from orchestrator.faults.job_control import MENDS_NAME
from orchestrator.record.ledger import Ledger
from orchestrator.record.ledger_home import bring_home, has_ledger


class UnsafeWorkdir(SpecError):
    """The workdir is not the user's alone: its files (the owed cluster actions the controller runs,
    the lock, the pickles the local backend loads) could be another user's."""


def claim_workdir(campaign: Campaign) -> None:
    """Create the workdir with ``workdir_mode`` (0700 unless the team shares it), or accept one that
    exists only if it is the user's and no more open than that mode (as ssh refuses a key with loose
    modes); and set the umask so that every file the drill writes (and its jobs: the scheduler keeps
    the submitter's umask) is as private. Raises UnsafeWorkdir, naming the fix."""
    workdir, mode = campaign.workdir, int(campaign.workdir_mode, 8)
    check_ancestors(Path(os.path.realpath(workdir)), mode)  # before the workdir is made in one
    try:
        workdir.mkdir(mode=mode)
        os.chmod(workdir, mode)  # mkdir's mode went through the umask
    except FileExistsError:
        pass
    check_workdir(workdir, mode, f"workdir_mode {campaign.workdir_mode}")
    os.umask(~mode & 0o077)


def check_workdir(workdir: Path, mode: int = 0o770, allowed: str = "at most group-writable",
                  what: str = "the workdir") -> Path:
    """``workdir``'s real path (symlinks resolved: use it, not ``workdir``, from here on), once it is a
    directory of the user's no more writable than ``mode`` allows, under directories nobody else may
    rename it in; else UnsafeWorkdir (before anything in it is read: the cancel of a drill whose spec
    is not read yet)."""
    workdir = Path(os.path.realpath(workdir))
    check_ancestors(workdir, mode, what)
    info = os.lstat(workdir)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeWorkdir(f"workdir {workdir} is not a directory")
    if info.st_uid != os.geteuid():
        raise UnsafeWorkdir(f"workdir {workdir} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): "
                            "another user could have put files there that a drill runs or loads; use a workdir "
                            "of your own")
    if loose := info.st_mode & 0o022 & ~mode:
        raise UnsafeWorkdir(f"workdir {workdir} is writable by {'group' if loose & 0o020 else 'others'} "
                            f"(mode {stat.S_IMODE(info.st_mode):04o}; {allowed}): chmod go-w {workdir}, or "
                            "set workdir_mode in the spec if the team shares it on purpose")
    _check_entries(workdir, mode)
    return workdir


def check_ancestors(workdir: Path, mode: int, what: str = "the workdir") -> None:
    """Whoever may write a directory above the workdir may rename the workdir away and put one of
    theirs in its place (as ssh's StrictModes reasons about a key's directories): each must be
    root's or the user's, and writable by nobody else, unless sticky (each entry stays its owner's)
    or ``mode`` shares the workdir with the group (the group is trusted then). ``what``: the
    directory checked, in words (the spec's checkpoint.directory is held to the same rule)."""
    group_trusted = bool(mode & 0o070)
    for ancestor in workdir.parents:
        try:
            info = os.stat(ancestor)
        except FileNotFoundError:  # to be made, by the drill, as private as the folder it holds
            continue
        if info.st_uid not in (0, os.geteuid()) and not group_trusted:
            raise UnsafeWorkdir(f"{ancestor}, above {what}, belongs to uid {info.st_uid}: its owner could move "
                                f"{what} away and put another in its place; keep it under directories of your own "
                                "(or root's), or set workdir_mode 0770 to trust the group")
        if info.st_mode & stat.S_ISVTX:
            continue
        loose = info.st_mode & (0o002 if group_trusted else 0o022)
        if loose:
            who = "others" if loose & 0o002 else "group"
            raise UnsafeWorkdir(f"{ancestor}, above {what}, is writable by {who} (mode "
                                f"{stat.S_IMODE(info.st_mode):04o}): they could move {what} away and put "
                                "another in its place; use a directory under directories only you may write (a sticky "
                                "one, such as /tmp, is fine)" + ("" if who == "others" else
                                                                 ", or set workdir_mode 0770 to trust the group"))


def _check_entries(workdir: Path, mode: int) -> None:
    """What lies in the workdir is the user's too, and no looser: a workdir that was once writable
    by others (its mode tightened since, as the refusal above asks) may hold a stranger's file the
    controller would read or run (owed-cluster-actions.json, controller.json, pickles)."""
    for entry in workdir.iterdir():
        info = entry.lstat()
        if info.st_uid != os.geteuid():
            raise UnsafeWorkdir(f"{entry} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): another user "
                                "put it there while the workdir was open to them; remove it (or start a new workdir)")
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022 & ~mode:
            raise UnsafeWorkdir(f"{entry} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): "
                                f"chmod go-w {entry}")


def prepare_workdir(campaign: Campaign) -> Path | None:
    """Archive a finished drill found in the workdir (renamed, never deleted); return where it went.
    What it still owes (orchestrator.faults.job_control: a mend that failed) stays in the workdir.

    An unfinished drill is resumed by the controller, but only with the spec it was started with.
    """
    claim_workdir(campaign)  # before anything in it is read
    if not has_ledger(campaign.workdir):
        return None
    ledger = Ledger.in_workdir(campaign.workdir)
    try:
        finished = ledger.meta("finished")
        started_with = ledger.meta("spec")
    finally:
        ledger.close()
    if finished is None:
        if started_with is not None and started_with != campaign.model_dump(mode="json"):
            raise SpecError(
                f"workdir {campaign.workdir} holds an unfinished drill started with another spec; "
                "use another workdir, or finish that drill with the spec it was started with"
            )
        return None
    bring_home(campaign.workdir)  # a controller that ended between the two: the record goes with the runs
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(float(finished)))
    archive = campaign.workdir.with_name(f"{campaign.workdir.name}.{stamp}")
    suffix = 1
    while archive.exists():
        archive = campaign.workdir.with_name(f"{campaign.workdir.name}.{stamp}-{suffix}")
        suffix += 1
    campaign.workdir.rename(archive)
    owed = archive / MENDS_NAME
    if owed.exists():  # actions the finished drill still owes (a failed mend): its successor tries them first
        claim_workdir(campaign)
        os.replace(owed, campaign.workdir / MENDS_NAME)
    return archive
