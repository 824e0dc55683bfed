"""workload.mpi site: the libmpi the ranks' mpi4py would load, looked up on this node as mpi4py
looks for it (orchestrator/campaign/mpi.py), without loading it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign import mpi
from orchestrator.campaign.mpi import site_libmpi


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site's MPI in a directory of its own, known to no loader cache."""
    lib = tmp_path / "site-mpi" / "lib"
    lib.mkdir(parents=True)
    (lib / "libmpi.so.40").write_bytes(b"\x7fELF")
    monkeypatch.setattr(mpi, "LOADER_CACHE", tmp_path / "no-cache")
    for name in ("MPI4PY_LIBMPI", "LD_LIBRARY_PATH"):
        monkeypatch.delenv(name, raising=False)
    return lib


def test_mpi4pys_forms_of_a_library_name_are_found(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-review: a directory, a bare name and $VAR/~ are what mpi4py takes in MPI4PY_LIBMPI; each
    was taken for a missing file, and a working setup refused."""
    assert site_libmpi({"MPI4PY_LIBMPI": str(site)}) == str(site / "libmpi.so.40")
    assert site_libmpi({"MPI4PY_LIBMPI": "libmpi.so.40", "LD_LIBRARY_PATH": str(site)}) == str(site / "libmpi.so.40")
    monkeypatch.setenv("SITE_MPI_ROOT", str(site.parent))
    assert site_libmpi({"MPI4PY_LIBMPI": "/nope.so:$SITE_MPI_ROOT/lib/libmpi.so.40"}) == str(site / "libmpi.so.40")


def test_without_mpi4py_libmpi_the_loaders_search_decides(site: Path) -> None:
    assert site_libmpi({}) is None  # nothing in LD_LIBRARY_PATH, no cache
    assert site_libmpi({"LD_LIBRARY_PATH": f"/nowhere:{site}"}) == str(site / "libmpi.so.40")
    assert site_libmpi({"MPI4PY_LIBMPI": str(site / "libmpi.so.12")}) is None
