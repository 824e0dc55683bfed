"""Checkpoints kept apart from the run directory (``checkpoint.directory``: a scratch filesystem,
the run directories on home): each run's ``<run>/checkpoints`` is a link to its own directory
there, made before anything is submitted, so every reader and writer of checkpoints (the ranks,
the controller's checks, the corrupt-checkpoint fault, the report) goes on using the run's paths.
A checkpoint is only ever moved within that directory (published by a rename there, quarantined
to its ``quarantine/``): never across filesystems."""

from __future__ import annotations

import os

from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import SpecError


def checkpoint_home_refusals(runs: list[RunConfig]) -> list[str]:
    """Up front (validate, plan, drill): each run's checkpoint directory can be made by this user,
    and is no run directory's own."""
    problems = {}
    for run in runs:
        home = run.checkpoint_home
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
    return list(problems.values())


def link_checkpoint_homes(runs: list[RunConfig]) -> None:
    """Each run's checkpoint directory made (0700) and ``<run>/checkpoints`` linked to it; a link a
    restarted controller finds is kept if it leads there. SpecError if the run already keeps
    checkpoints of its own somewhere else (the spec changed under an unfinished drill)."""
    for run in runs:
        home = run.checkpoint_home
        if home is None:
            continue
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
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

