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

from faultdrill_cli import (  # noqa: F401  (the campaign tests import them from here)
    campaign_copy,
    full_campaigns,
    keep_sweep_points,
    leave_out_fault_kinds,
)


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
