"""Issue 22: the drill on a site that is not the project's own, on the real cluster. No accounting
(slurmdbd stopped: `scripts/cluster accounting off`, sacct failing): a preempted drill recovers
from the queue and the run's own files, and its report says what it knew less of. Skewed clocks
(`scripts/cluster skew on`): the drill reads each node's offset and measures every phase on the
login clock; the doctor warns of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from experiments.layout import RunPaths
from orchestrator.record.clocks import load_clocks

DRILL_TIMEOUT_S = 600


def _spec(shared_tmp: Path) -> Path:
    """Two runs on fd-n1 (-0.8 s under the skew profile) and fd-n2 (+1.3 s), one rank each, and
    their shared twin: rank 1 (fd-n2) killed at step 150; the job preempted at step 120 (the
    scheduler ends it: only the scheduler could date that end)."""
    spec: dict[str, Any] = {
        "name": "site-profiles", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 300, "step_s": 0.01, "seed": 4, "batch_size": 16},
        "checkpoint": {"every_steps": 100, "keep": 2},
        "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug",
                      "extra_directives": ["--nodelist=fd-n1,fd-n2"]},
        "restart": {"max_restarts": 2, "poll_interval_s": 0.2},
        "baseline": True, "parallel_runs": 3,
        "sweep": {"grid": [{"faults": [[{"kind": "kill-rank", "after": {"at_step": 150}, "rank": 1,
                                          "signal": "SIGKILL"}]]},
                           {"faults": [[{"kind": "preempt", "after": {"at_step": 120}, "grace_s": 20}]]}]},
    }
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_without_accounting_and_on_skewed_clocks_a_drill_recovers_measures_on_one_clock_and_says_so(
        shared_tmp: Path, no_accounting: None, skewed_clocks: dict[str, float]) -> None:
    """Two profiles at once (they do not interfere). No accounting: the preempted run recovers from
    the queue and the run's own files, and the report says what it knew less of. Skewed clocks: the
    drill reads both nodes' offsets, the kill's moment (stamped on fd-n2) and the new job's start
    are moved onto the login clock, the kill is credited with the failure it caused, no phase is
    clamped, and both runs end as their twin. The uncorrected stamps show what was reported
    before: the kill 'after' its own detection."""
    sacct = subprocess.run(["sacct", "-X", "-n"], capture_output=True, text=True, timeout=60)
    assert sacct.returncode != 0, "the profile: sacct does not answer"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(_spec(shared_tmp)), "--format",
                           "json"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    killed, preempted = (next(run for run in report["runs"] if run["faults"] and run["faults"][0]["kind"] == kind)
                         for kind in ("kill-rank", "preempt"))
    for run in (killed, preempted):
        assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["attempts"]
        assert len(run["attempts"]) == 2 and run["recoveries"][0]["clocks_not_read"] == [], run["recoveries"]

    [recovery] = preempted["recoveries"]
    assert recovery["failure_class"] == "PREEMPTED" and recovery["lost_steps"] == 0, recovery
    assert "ranks saved step" in preempted["faults"][0]["detail"], "rank 0's warned checkpoint, on the login clock"
    [note] = report["site_notes"]
    assert note.startswith("accounting (sacct) did not answer") and "end time" in note

    clocks = load_clocks(RunPaths(shared_tmp / "work" / "runs" / killed["run_id"]).clocks_file(0))
    for node in ("fd-n1", "fd-n2"):
        reading = clocks.readings[node]
        assert abs(reading.offset_s - skewed_clocks[node]) <= reading.uncertainty_s + 0.005, (node, reading)
    [fault] = killed["faults"]
    [recovery] = killed["recoveries"]
    assert fault["outcome"] == "injected" and "fd-n2" in fault["target"], (fault["outcome"], fault["detail"])
    assert killed["attempts"][0]["ended"] - fault["at"] < 0, "uncorrected, fd-n2's stamp of the kill is after its detection"
    assert recovery["clock_correction_s"] < 0.05 and 0.0 < recovery["detect_s"] < 5.0 and recovery["queue_s"] > 0, recovery
    bounds = recovery["phase_uncertainty_s"]
    assert bounds["resubmit_s"] == 0 and 0 < bounds["detect_s"] < 0.05 and 0 < bounds["ttr_s"] < 0.1, bounds
    assert set(recovery["clock_offsets"]) == {"fd-n1", "fd-n2"}

    text = " ".join(subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", str(shared_tmp / "work")],
                                   capture_output=True, text=True, timeout=120).stdout.split())
    assert "This site: accounting (sacct) did not answer" in text
    assert "node clocks against the login node's (s): fd-n1 -0.8" in text, text[-3000:]


def test_the_doctor_warns_of_the_skewed_clocks_and_names_the_nodes(shared_tmp: Path,
                                                                    skewed_clocks: dict[str, float]) -> None:
    """The skew profile's expected warning: the clocks check names each node off by more than 50 ms."""
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "doctor", "--backend", "slurm", "--workdir",
                           str(shared_tmp / "work"), "--nodes", "2", "--partition", "debug", "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    document = json.loads(done.stdout)
    [clocks] = [check for check in document["checks"] if check["name"] == "clocks"]
    nodes = {node["node"]: node for node in document["nodes"]}
    assert clocks["status"] == "warn" and all(name in clocks["detail"] for name in nodes), clocks
    for name, node in nodes.items():
        assert abs(node["clock_offset_s"] - skewed_clocks[name]) <= node["clock_uncertainty_s"] + 0.005, node
