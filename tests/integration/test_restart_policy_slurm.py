"""The restart policy's exclude_node on the real 3-node cluster (issue 9): a node that crashes for
the rest of the drill is named by the injector's record at once (NODE_FAIL, long before Slurm's
SlurmdTimeout), the next attempt is submitted with --exclude of it and runs on the two nodes left,
and the run ends bit for bit as its fault-free twin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.runtime.hostlist import expand_hostlist

pytestmark = pytest.mark.integration

DRILL_TIMEOUT_S = 900


def _spec(shared_tmp: Path) -> Path:
    spec: dict[str, Any] = {
        "name": "slurm-exclude-node", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": {"framework": "torch", "params": 20000, "steps": 3000, "seed": 9, "batch_size": 16},
        "checkpoint": {"every_steps": 1000, "keep": 2},
        # A node fault hits every job on the node: the runs hold theirs alone, one after the other.
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug",
                      "extra_directives": ["--exclusive"]},
        "faults": [{"kind": "node-crash", "after": {"at_step": 1200}, "node": -1, "down_s": None}],
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2, "hang_timeout_s": 5, "checkpoint_timeout_s": 30},
        "baseline": True,
    }
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _node_list(job_id: str) -> list[str]:
    text = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "NodeList", "-j", job_id.split(";")[0]],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return expand_hostlist(text)


def test_a_crashed_node_is_excluded_from_the_next_attempt(shared_tmp: Path, cluster, slurm) -> None:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(_spec(shared_tmp)), "--format",
                           "json"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    run = next(run for run in report["runs"] if run["run_id"] == "r000")
    for attempt in run["attempts"]:
        slurm.track(attempt["job_id"].split(";")[0])
    assert run["status"] == "completed" and run["identical_to_baseline"] is True
    [fault] = run["faults"]
    lost = fault["target"].removeprefix("node ")
    assert fault["outcome"] == "injected" and lost in cluster and "rest of the drill" in fault["detail"]
    failed, restarted = run["attempts"]
    assert failed["failure_class"] == "NODE_FAIL" and failed["failed_nodes"] == [lost]
    assert restarted["excluded_nodes"] == [lost]
    assert lost not in _node_list(restarted["job_id"]) and lost in _node_list(failed["job_id"])
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "NODE_FAIL" and recovery["resumed_from_step"] == 1000
    # The drill's end restored the node (the mend it owed): the cluster is whole again.
    states = subprocess.run(["sinfo", "-h", "-N", "-n", lost, "-o", "%t"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.split()
    assert states and states[0] in ("idle", "mix", "alloc"), states
