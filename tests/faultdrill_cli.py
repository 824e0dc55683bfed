"""The faultdrill command as a user types it, for the drill and cluster tiers (drill: the local
backend; cluster: the real cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from orchestrator.campaign.spec import anchored

FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]
CAMPAIGNS = Path(__file__).resolve().parents[1] / "experiments" / "campaigns"


def campaign_copy(name: str, shared: Path, **overrides: Any) -> Path:
    """experiments/campaigns/<name>.yaml with its workdir at ``shared``/work (and top-level sections
    replaced by ``overrides``); the copy's path. A script's relative paths still point where the
    original's do."""
    spec = yaml.safe_load((CAMPAIGNS / f"{name}.yaml").read_text())
    spec.update(overrides)
    spec["workdir"] = str(shared / "work")
    workload = spec.get("workload", {})
    for field in ("command", "resume_args"):  # what names a file next to the original, by its absolute path
        if workload.get(field):
            workload[field] = [anchored(str(word), CAMPAIGNS) for word in workload[field]]
    path = shared / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def faultdrill(*args: str, expect: int = 0, timeout: float = 180) -> str:
    """Run ``faultdrill ARGS``; what it printed (stdout, then stderr). Fails unless it exits ``expect``."""
    done = subprocess.run([*FAULTDRILL, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == expect, f"{args}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def faultdrill_on(host: str, *args: str, expect: int = 0, timeout: float = 180) -> str:
    """``faultdrill ARGS`` as on another login node: in a UTS namespace of its own whose host name is
    ``host`` (same filesystem, same kernel: the workdir and its lock are shared, the host is not)."""
    namespaced = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', host, *FAULTDRILL, *args]
    done = subprocess.run(namespaced, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == expect, f"{args} on {host}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def status(workdir: Path) -> dict[str, Any]:
    """``faultdrill status WORKDIR --format json``."""
    return json.loads(faultdrill("status", str(workdir), "--format", "json"))


def report(workdir: Path) -> dict[str, Any]:
    """``faultdrill report WORKDIR --format json``."""
    return json.loads(faultdrill("report", str(workdir), "--format", "json"))


def full_campaigns() -> bool:
    """FAULTDRILL_FULL=1: the campaigns at full size (by hand); CI runs their cut."""
    return bool(os.environ.get("FAULTDRILL_FULL"))


# A parametrized case that runs with FAULTDRILL_FULL=1 only (scripts/test --full): CI keeps one case
# of the feature, the others are the long campaigns' (the CI time bound).
FULL_ONLY = pytest.mark.skipif(not full_campaigns(), reason="runs with FAULTDRILL_FULL=1 (scripts/test --full)")


def leave_out_fault_kinds(spec: Path, kinds: "set[str]") -> None:
    """The campaign copy at ``spec`` without the sweep's runs whose first fault is of one of ``kinds``
    (CI's cut of a catalogue: the kinds another CI test drills where the same code acts)."""
    data = yaml.safe_load(spec.read_text())
    grids = data["sweep"]["grid"] if isinstance(data["sweep"]["grid"], list) else [data["sweep"]["grid"]]
    for grid in grids:
        grid["faults"] = [faults for faults in grid["faults"] if faults[0]["kind"] not in kinds]
    data["sweep"]["grid"] = [grid for grid in grids if grid["faults"]]
    spec.write_text(yaml.safe_dump(data))


def keep_sweep_points(spec: Path, keep: "Callable[[dict[str, Any]], bool]") -> None:
    """The campaign copy at ``spec`` without the sweep grid's points that ``keep`` refuses."""
    data = yaml.safe_load(spec.read_text())
    data["sweep"]["grid"] = [point for point in data["sweep"]["grid"] if keep(point)]
    spec.write_text(yaml.safe_dump(data))
