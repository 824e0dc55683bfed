"""Backends: local (embedded default), slurm. Each is a submitit executor underneath."""

from __future__ import annotations

from orchestrator.backends.base import Backend

BACKEND_NAMES = ("local", "slurm")


def make_backend(name: str, drill_id: str) -> Backend:
    if name == "local":
        from orchestrator.backends.local import LocalBackend

        return LocalBackend(drill_id)
    if name == "slurm":
        from orchestrator.backends.slurm import SlurmBackend

        return SlurmBackend(drill_id)
    raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKEND_NAMES)}")
