"""``faultdrill doctor`` on the real cluster (real-sites issue, `faultdrill doctor`): a test job on
two nodes, its facts seen from the login node, each node's clock read against the login node's,
and the site's scheduler checks. Under the site profiles (each one's expected warnings):
tests/cluster/test_site_profiles.py (user, no-accounting, skew, limits, cgroup) and
tests/cluster/test_fault_catalogue.py (scratch)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conftest import CLUSTER_STATE_DIR

DOCTOR_TIMEOUT_S = 300


def _doctor(workdir: Path, *extra: str, backend: str = "slurm") -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "doctor", "--backend", backend, "--workdir",
                           str(workdir), "--nodes", "2", "--partition", "debug", "--framework", "torch",
                           "--format", "json", *extra], capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def _statuses(document: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in document["checks"]}


def test_the_doctor_runs_a_test_job_reads_each_nodes_clock_and_checks_the_site(shared_tmp: Path, wait_until) -> None:
    code, document = _doctor(shared_tmp / "work")
    statuses = _statuses(document)
    assert code == 0 and document["summary"]["fail"] == 0, document
    for name in ("scheduler", "accounting", "limits", "test job", "nodes: python", "nodes: framework", "clocks",
                 "shared filesystem", "workdir: flock", "workdir: rename"):
        assert statuses[name] == "pass", (name, document)
    nodes = document["nodes"]
    assert len({node["node"] for node in nodes}) == 2, nodes
    for node in nodes:  # the cluster's nodes share this host's clock: an offset within what was read
        assert node["clock_uncertainty_s"] is not None and 0 <= node["clock_uncertainty_s"] < 0.05, node
        assert abs(node["clock_offset_s"]) <= node["clock_uncertainty_s"] + 0.005, node
        assert node["visible_after_s"] is not None and node["framework_version"], node
    assert not list((shared_tmp / "work" / ".doctor").iterdir()), "a passing doctor leaves no probe files"
    assert (shared_tmp / "work").stat().st_mode & 0o777 == 0o700, "made as a drill makes its workdir"
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-n", "fd-doctor", "-t", "PD,R,CG"], capture_output=True,
                                          text=True, timeout=30).stdout.strip(), timeout=60,
               message="the doctor's test job to end")


def _spec(shared_tmp: Path, backend: str, checkpoints: Path) -> Path:
    spec = {"name": "doctor", "backend": backend, "workdir": str(shared_tmp / "work"),
            "workload": {"framework": "torch", "params": 2000, "steps": 10, "seed": 1},
            "checkpoint": {"every_steps": 5, "directory": f"{checkpoints}/{{run_id}}"},
            "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00", "partition": "debug"}}
    path = shared_tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _doctor_spec(spec: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "doctor", str(spec), "--format", "json"],
                          capture_output=True, text=True, timeout=DOCTOR_TIMEOUT_S)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_the_doctor_on_pbs_runs_its_test_job_through_qsub_and_reads_each_nodes_clock(shared_tmp: Path,
                                                                                     wait_until) -> None:
    """The doctor on PBS (issue 22), through Slurm's Torque wrappers here, given a spec: the server
    named, the accounting under the wrappers and the mpiexec that starts the ranks checked, the test
    job submitted with qsub, started on two nodes by mpiexec as the drill's ranks are, each node's
    clock read through the PBS backend's way onto a node, and the spec's checkpoint directory (on the
    shared filesystem) seen and written by both nodes."""
    code, document = _doctor_spec(_spec(shared_tmp, "pbs", shared_tmp / "scratch"))
    statuses = _statuses(document)
    assert code == 0 and document["summary"]["fail"] == 0, document
    [scheduler] = [check for check in document["checks"] if check["name"] == "scheduler"]
    assert "Torque wrappers" in scheduler["detail"], scheduler
    for name in ("accounting", "limits", "mpiexec", "test job", "nodes: python", "nodes: framework", "clocks",
                 "shared filesystem", "checkpoints: rename", "checkpoints: nodes"):
        assert statuses[name] == "pass", (name, document)
    nodes = document["nodes"]
    assert len({node["node"] for node in nodes}) == 2, nodes
    for node in nodes:
        assert node["clock_uncertainty_s"] is not None and abs(node["clock_offset_s"]) <= node["clock_uncertainty_s"] + 0.005
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-n", "fd-doctor", "-t", "PD,R,CG"], capture_output=True,
                                          text=True, timeout=30).stdout.strip(), timeout=60,
               message="the doctor's test job to end")


def test_a_checkpoint_directory_on_the_nodes_private_tmp_fails_naming_each_node(shared_tmp: Path) -> None:
    """The cluster's nodes each have a /tmp of their own: a spec whose checkpoint.directory is
    there would write each node's checkpoints where no other node, nor the login node, finds them.
    The doctor fails it, naming both nodes, and leaves none of its files behind."""
    private = Path("/tmp") / f"fd-doctor-{shared_tmp.name[-8:]}"
    try:
        code, document = _doctor_spec(_spec(shared_tmp, "slurm", private))
        [check] = [check for check in document["checks"] if check["name"] == "checkpoints: nodes"]
        assert code == 1 and check["status"] == "fail" and "same path" in check["fix"], check
        for node in {node["node"] for node in document["nodes"]}:
            assert f"{node} does not see the login node's file" in check["detail"], check
        assert _statuses(document)["checkpoints: rename"] == "pass", "the login node alone sees nothing wrong"
        assert not private.exists(), "the doctor checks a directory not made yet at its parent, makes none"
        places = [Path("/tmp"), *(CLUSTER_STATE_DIR / "nodes" / node["node"] / "tmp" for node in document["nodes"])]
        left = [path for place in places for path in place.glob(".faultdrill-doctor-*")]
        assert not left, "the doctor's files left on the login node or in a node's own /tmp"
    finally:
        shutil.rmtree(private, ignore_errors=True)
