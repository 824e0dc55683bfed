"""``faultdrill doctor`` on the local backend: its test job is this host's process, its clock read
over a real conversation with the probe, the framework imported there; every check passes or
says why (disk-full's small filesystem is the one expected warning on a big disk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.drill


def test_the_local_doctor_probes_this_host_and_reads_its_clock(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "doctor", "--backend", "local", "--workdir",
                           str(tmp_path / "work"), "--framework", "torch", "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    statuses = {check["name"]: check["status"] for check in document["checks"]}
    for name in ("scheduler", "test job", "nodes: python", "nodes: framework", "clocks", "workdir: flock"):
        assert statuses[name] == "pass", (name, document["checks"])
    [node] = document["nodes"]
    assert abs(node["clock_offset_s"]) <= node["clock_uncertainty_s"] + 0.001, node
    assert node["framework_version"].startswith("2."), node
    # A spec's checkpoint.directory is checked too (made as the drill makes it; a checkpoint is
    # published by a rename there), here in the table a person reads.
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "d", "backend": "local", "workdir": str(tmp_path / "work"),
                                "workload": {"framework": "torch", "steps": 10},
                                "checkpoint": {"directory": str(tmp_path / "scratch" / "{run_id}")}}))
    table = subprocess.run([sys.executable, "-m", "orchestrator.cli", "doctor", str(spec)],  # wide: no cell wraps
                           capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert table.returncode == 0 and "faultdrill doctor" in table.stdout and "PASS" in table.stdout, table.stdout
    said = " ".join(table.stdout.split())
    assert "checkpoints: rename" in said and "a rename replaces a file at once" in said, table.stdout
    assert not (tmp_path / "scratch").exists(), "the doctor checks a directory not made yet at its parent, makes none"

