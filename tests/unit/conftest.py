"""The unit tier's rules, enforced: a unit test starts no process and imports no framework (a test
that needs either is a drill: tests/drill, or ``@pytest.mark.drill`` where it stands). Each test is
checked on its own, so the one that broke the rule is named; a test module that imports a framework
when it is collected is named too."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Iterator, NoReturn

import pytest

FRAMEWORKS = ("torch", "tensorflow", "chainer", "lightning", "keras", "mpi4py")
UNIT_FOLDER = os.path.dirname(os.path.abspath(__file__))


def loaded_frameworks() -> set[str]:
    return {name for name in FRAMEWORKS if name in sys.modules}


_loaded_at_last_report = loaded_frameworks()


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("a unit test starts no process: it is a drill (tests/drill, or @pytest.mark.drill)")


@pytest.fixture(autouse=True)
def unit_tier_rules(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse)
    loaded_before = loaded_frameworks()
    yield
    imported = sorted(loaded_frameworks() - loaded_before)
    assert not imported, f"a unit test imports no framework ({', '.join(imported)}): it is a drill"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A unit test module that imports a framework as it is collected fails its collection."""
    global _loaded_at_last_report
    now = loaded_frameworks()
    imported, _loaded_at_last_report = sorted(now - _loaded_at_last_report), now
    in_unit = report.nodeid.startswith("tests/unit/") and report.nodeid.endswith(".py")
    if imported and in_unit and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid} imports {', '.join(imported)} when it is collected: a unit test module "
                           "imports no framework (move the module to tests/drill)")
