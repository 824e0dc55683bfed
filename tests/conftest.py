"""Test tiers (docs/contributing.md). A test's tier is its folder's, unless it carries a tier marker:

* ``tests/unit``    marker ``unit``: no process started, no framework imported, no drill (the whole
                    tier runs in under two minutes: ``scripts/test --fast``); tests/unit/conftest.py
                    enforces it, test by test. A test in a unit file that needs a process is marked
                    ``@pytest.mark.drill`` where it stands;
* ``tests/drill``   marker ``drill``: local drills, real rank processes, the frameworks;
* ``tests/cluster`` marker ``cluster``: the real local Slurm cluster and the PBS wrappers.

``scripts/test`` runs the unit tier first, in a process of its own (no drill module may have loaded
a framework before it), then two pytest processes side by side: ``-m cluster`` (the cluster's nodes
are shared, one drill at a time) and ``-m drill`` (most of the cluster lane's time is spent waiting
on Slurm, not on the CPUs).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "drill", "cluster")


def folder_tier(item: pytest.Item) -> str:
    """The tier a test's folder gives it: the first folder below tests/."""
    parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in TIERS:
        raise pytest.UsageError(f"{item.nodeid}: a test lives in one of tests/{{{','.join(TIERS)}}}/")
    return parts[0]


def tier_of(item: pytest.Item) -> str:
    """The folder's tier; a unit file's test may be marked ``drill`` (the one override allowed: a
    test marked ``unit`` elsewhere would escape the unit tier's guard in tests/unit/conftest.py)."""
    folder = folder_tier(item)
    marked = {tier for tier in TIERS if item.get_closest_marker(tier) is not None} - {folder}
    if not marked:
        return folder
    if folder == "unit" and marked == {"drill"}:
        return "drill"
    raise pytest.UsageError(f"{item.nodeid}: a test in tests/{folder}/ is marked {sorted(marked)}; "
                            "only a test in tests/unit/ may be marked drill")


def pytest_configure(config: pytest.Config) -> None:
    """scripts/test stops a lane with SIGTERM (the unit tier or mypy failed, CI was cancelled): taken
    as an interrupt, so that fixtures tear down (the cluster's jobs cancelled, a drill's controller
    stopped), not as the death without teardown that is Python's default."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test's tier marker, as it is collected (before ``-m`` selects by marker)."""
    tier = tier_of(item)
    if item.get_closest_marker(tier) is None:
        item.add_marker(getattr(pytest.mark, tier))


# What each test costs the machine: all processes' CPU (/proc/stat) while it ran, its fixtures'
# set-up included. On 2 cores CI time follows CPU, not each test's wall time: the 30 dearest are
# printed beside --durations, to choose what CI leaves to FAULTDRILL_FULL.
CPU_REPORTED = 30
_machine_cpu_s: dict[str, float] = {}


def machine_cpu_seconds() -> float | None:
    """CPU seconds every process of the machine has used since boot (None where /proc is absent)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    busy = [int(value) for index, value in enumerate(fields[:8]) if index not in (3, 4)]  # not idle, iowait
    return sum(busy) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 - a hook wrapper
    before = machine_cpu_seconds()
    yield
    after = machine_cpu_seconds()
    if before is not None and after is not None:
        _machine_cpu_s[item.nodeid] = after - before


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    dearest = sorted(_machine_cpu_s.items(), key=lambda item: -item[1])[:CPU_REPORTED]
    if not dearest or sum(seconds for _, seconds in dearest) < 1.0:
        return
    beside = " and the other lane's tests" if os.environ.get("FAULTDRILL_TEST_LANES", "1") != "1" else ""
    terminalreporter.write_sep("=", f"{len(dearest)} dearest tests in machine CPU (all processes{beside}, "
                                    "set-up included)")
    for nodeid, seconds in dearest:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")


@pytest.fixture(autouse=True)
def _umask_as_it_was() -> Iterator[None]:
    """A drill run in the test's own process sets the umask for its workdir (claim_workdir: 077
    unless the spec shares it); the next test's files and directories must not inherit it (an
    ordinary user's test could no longer enter its own shared directory: seen in CI)."""
    before = os.umask(0o022)
    os.umask(before)
    try:
        yield
    finally:
        os.umask(before)
