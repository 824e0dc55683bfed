"""Issue 22: the drill on a site that is not the project's own, on the real cluster. No accounting
(slurmdbd stopped: `scripts/cluster accounting off`, sacct failing): a preempted drill recovers
from the queue and the run's own files, and its report says what it knew less of."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

DRILL_TIMEOUT_S = 600


def _spec(shared_tmp: Path) -> Path:
    spec: dict[str, Any] = {
        "name": "site-no-accounting", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 200, "seed": 4, "batch_size": 16},
        "checkpoint": {"every_steps": 50, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00", "partition": "debug"},
        # A preemption: the scheduler ends the job (scancel), whose end only the scheduler can date.
        "faults": [{"kind": "preempt", "after": {"at_step": 120}, "grace_s": 20}],
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2},
    }
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_drill_without_accounting_recovers_from_the_queue_and_says_what_it_knew_less_of(
        shared_tmp: Path, no_accounting: None) -> None:
    sacct = subprocess.run(["sacct", "-X", "-n"], capture_output=True, text=True, timeout=60)
    assert sacct.returncode != 0, "the profile: sacct does not answer"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(_spec(shared_tmp)), "--format",
                           "json"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    [run] = report["runs"]
    assert run["status"] == "completed" and run["final_step"] == 200
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "PREEMPTED" and recovery["lost_steps"] == 0, recovery
    assert len(run["attempts"]) == 2
    [note] = report["site_notes"]
    assert note.startswith("accounting (sacct) did not answer") and "end time" in note
    text = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(shared_tmp / "work")],
                          capture_output=True, text=True, timeout=120).stdout
    assert "This site: accounting (sacct) did not answer" in text
