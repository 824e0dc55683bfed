"""Backends: local (embedded default), slurm, pbs. Each is a submitit executor underneath.

Nothing is imported here at module level: the PBS backend's submitit plugin lives in this package
and submitit loads it in every rank of every job, so importing the package must stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

BACKEND_NAMES = ("local", "slurm", "pbs")


def make_backend(name: str, drill_id: str) -> Backend:
    made: Backend = backend_class(name)(drill_id)  # type: ignore[call-arg]  # every concrete backend takes the drill id
    return made


def backend_class(name: str) -> type[Backend]:
    """The backend of that name (its class: what its site refuses is known before any drill id)."""
    if name == "local":
        from orchestrator.backends.local.backend import LocalBackend

        return LocalBackend
    if name == "slurm":
        from orchestrator.backends.slurm.backend import SlurmBackend

        return SlurmBackend
    if name == "pbs":
        from orchestrator.backends.pbs.backend import PBSBackend

        return PBSBackend
    raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKEND_NAMES)}")
