"""Running one of the repository's campaigns (experiments/campaigns/) in a test: a copy of its spec
whose workdir is the test's own, and the drill's JSON report (kept at FAULTDRILL_KEEP_REPORT, for
the figures of a by-hand run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def campaign_copy(name: str, shared: Path) -> Path:
    """experiments/campaigns/<name>.yaml with its workdir at ``shared``/work; the copy's path."""
    spec = yaml.safe_load((REPO / "experiments" / "campaigns" / f"{name}.yaml").read_text())
    spec["workdir"] = str(shared / "work")
    if spec.get("workload", {}).get("command") and not spec["workload"].get("cwd"):
        spec["workload"]["cwd"] = str(REPO / "experiments" / "campaigns")  # where its relative paths point
    path = shared / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def drill_report(spec: Path, timeout_s: float, html: bool = False) -> dict[str, Any]:
    """``faultdrill drill SPEC --format json``, its report; the report page only if asked (the
    strategies drill checks it on the real cluster; the others skip its ~2 s of plotting)."""
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(spec), "--format", "json",
                           *([] if html else ["--no-html"])], capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    if keep := os.environ.get("FAULTDRILL_KEEP_REPORT"):
        Path(keep).write_text(done.stdout)
        Path(keep + ".stderr").write_text(done.stderr)  # the controller's warnings
    return json.loads(done.stdout)
