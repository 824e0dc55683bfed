"""Test tiers (docs/contributing.md). A test's tier is its folder's, unless it carries a tier marker:

* ``tests/unit``    marker ``unit``: no process started, no framework imported, no drill (the whole
                    tier runs in under two minutes: ``scripts/test --fast``); tests/unit/conftest.py
                    enforces it, test by test. A test in a unit file that needs a process is marked
                    ``@pytest.mark.drill`` where it stands;
* ``tests/drill``   marker ``drill``: local drills, real rank processes, the frameworks;
* ``tests/cluster`` marker ``cluster``: the real local Slurm cluster and the PBS wrappers.

``scripts/test`` runs two pytest processes side by side: ``-m cluster`` (the cluster's nodes are
shared, one drill at a time) and ``-m "not cluster"`` (most of the cluster lane's time is spent
waiting on Slurm, not on the CPUs).
"""

from __future__ import annotations

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
    marked = [tier for tier in TIERS if item.get_closest_marker(tier) is not None]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: one tier a test, not {marked}")
    return marked[0] if marked else folder_tier(item)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test's tier marker, as it is collected (before ``-m`` selects by marker)."""
    tier = tier_of(item)
    if item.get_closest_marker(tier) is None:
        item.add_marker(getattr(pytest.mark, tier))
