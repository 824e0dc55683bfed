"""The faultdrill command as a user types it, for the tests of both suites (unit: the local
backend; integration: the real cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]


def faultdrill(*args: str, expect: int = 0, timeout: float = 180) -> str:
    """Run ``faultdrill ARGS``; what it printed (stdout, then stderr). Fails unless it exits ``expect``."""
    done = subprocess.run([*FAULTDRILL, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == expect, f"{args}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def status(workdir: Path) -> dict[str, Any]:
    """``faultdrill status WORKDIR --format json``."""
    return json.loads(faultdrill("status", str(workdir), "--format", "json"))


def report(workdir: Path) -> dict[str, Any]:
    """``faultdrill report WORKDIR --format json``."""
    return json.loads(faultdrill("report", str(workdir), "--format", "json"))
