"""Checkpoints kept apart from the run directory (``checkpoint.directory``: a scratch filesystem,
the run directories on home): each run's ``<run>/checkpoints`` is a link to its own directory
there, made before anything is submitted, so every reader and writer of checkpoints (the ranks,
the controller's checks, the corrupt-checkpoint fault, the report) goes on using the run's paths.
A checkpoint is only ever moved within that directory (published by a rename there, quarantined
to its ``quarantine/``): never across filesystems."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import SpecError
from orchestrator.control.workdir import UnsafeWorkdir, check_ancestors, check_workdir

PRIVATE = 0o700
CHECKPOINTS = "checkpoint.directory"


def checkpoint_home_refusals(runs: list[RunConfig]) -> list[str]:
    """Up front (validate, plan, drill): each run's checkpoint directory can be made by this user,
    is no run directory's own, and lies under directories nobody the spec does not trust may
    rename it in (the rule ``link_checkpoint_homes`` holds it to when the drill starts)."""
    problems = {}
    for run in runs:
        home = run.checkpoint_root
        if home is None:
            continue
        if home.resolve().is_relative_to(run.paths.root.resolve()):
            problems["inside"] = (f"checkpoint.directory {run.campaign.checkpoint.directory}: inside the run directory "
                                  "(the default already keeps checkpoints there; name another filesystem's path)")
            continue
        existing = next(parent for parent in (home, *home.parents) if parent.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            problems[str(existing)] = (f"checkpoint.directory {run.campaign.checkpoint.directory}: {existing} is not a "
                                       "directory you may write, so the runs' checkpoint directories cannot be made")
            continue
        try:  # by the real path, as the drill's start checks it (a link to a directory others may write)
            check_ancestors(Path(os.path.realpath(home)), trusted_mode(run), CHECKPOINTS)
        except UnsafeWorkdir as error:
            problems[f"ancestors {existing}"] = f"checkpoint.directory {run.campaign.checkpoint.directory}: {error}"
    return list(problems.values())


def trusted_mode(run: RunConfig) -> int:
    """The spec's workdir_mode: whom it trusts (the group, where it shares the workdir) it trusts
    above the checkpoint directory too."""
    return int(run.campaign.workdir_mode, 8)


def link_checkpoint_homes(runs: list[RunConfig], drill_id: str) -> None:
    """Each run's checkpoint directory of this drill made (0700, under directories nobody else may
    rename it in) and ``<run>/checkpoints`` linked to it; a link a restarted controller finds is
    kept if it leads there. SpecError if the run already keeps checkpoints of its own somewhere else
    (the spec changed under an unfinished drill), or if the directory is not safe to load from."""
    for run in runs:
        home = run.checkpoint_home(drill_id)
        if home is None:
            continue
        _make_private(home, trusted_mode(run))
        link = run.paths.checkpoints
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            if link.resolve() != home.resolve():
                raise SpecError(f"{run.run_id}: {link} leads to {link.resolve()}, not checkpoint.directory's {home}: "
                                "the spec changed under an unfinished drill (put it back, or start a new workdir)")
            continue
        if link.exists():
            if any(link.iterdir()):
                raise SpecError(f"{run.run_id}: {link} already holds checkpoints; checkpoint.directory ({home}) "
                                "was not in the spec that wrote them (put it back, or start a new workdir)")
            link.rmdir()
        os.symlink(home, link)



def _make_private(home: Path, trusted: int) -> None:
    """The drill's checkpoint folder: made 0700, the user's, and under directories that nobody the
    spec does not trust (``trusted``: its workdir_mode) may rename it in (the workdir's rule: the
    ranks load what is there)."""
    try:
        check_ancestors(home, trusted, CHECKPOINTS)
        for folder in (*reversed(home.parents), home):
            if not folder.exists():
                folder.mkdir(mode=PRIVATE)
                os.chmod(folder, PRIVATE)
        check_workdir(home, trusted, "as the spec's workdir_mode allows", what=CHECKPOINTS)
    except UnsafeWorkdir as error:
        raise SpecError(f"checkpoint.directory: {error}") from None
