"""The unit tier's rules, enforced: a unit test starts no process and imports no framework (a test
that needs either is a drill: tests/drill, or ``@pytest.mark.drill`` where it stands). Each test is
checked on its own, so the one that broke the rule is named; a test module that imports a framework
when it is collected fails its collection. ``scripts/test`` runs this tier in a process of its own,
so that no drill module has loaded a framework before it."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
from typing import Any, Generator, Iterator, NoReturn

import pytest

FRAMEWORKS = ("torch", "tensorflow", "chainer", "lightning", "keras", "mpi4py")
PROCESS_STARTS = ((os, "fork"), (os, "forkpty"), (os, "system"), (os, "posix_spawn"), (os, "posix_spawnp"),
                  (_posixsubprocess, "fork_exec"))
REFUSED = "a unit test starts no process: it is a drill (tests/drill, or @pytest.mark.drill)"


def loaded_frameworks() -> set[str]:
    return {name for name in FRAMEWORKS if name in sys.modules}


@pytest.fixture(autouse=True)
def unit_tier_rules(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    refused: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        refused.append(REFUSED)  # kept: code under test that catches the error must not hide it
        raise AssertionError(REFUSED)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    for module, name in PROCESS_STARTS:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)
    loaded_before = loaded_frameworks()
    yield
    assert not refused, REFUSED
    imported = sorted(loaded_frameworks() - loaded_before)
    assert not imported, f"a unit test imports no framework ({', '.join(imported)}): it is a drill"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                          pytest.CollectReport]:
    """A unit test module that imports a framework as it is collected fails its collection."""
    loaded_before = loaded_frameworks()
    report = yield
    imported = sorted(loaded_frameworks() - loaded_before)
    in_unit = isinstance(collector, pytest.Module) and collector.nodeid.startswith("tests/unit/")
    if imported and in_unit and report.passed:
        report.outcome = "failed"
        report.result = []
        report.longrepr = (f"{collector.nodeid} imports {', '.join(imported)} when it is collected: a unit test "
                           "module imports no framework (move it to tests/drill)")
    return report
