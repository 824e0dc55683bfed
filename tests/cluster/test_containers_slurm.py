"""Issue 22 item 7 on the real cluster, which has no pyxis plugin: a spec whose ranks run in a
container (``resources.container``) is refused at plan, naming what is missing, with nothing made
or submitted; the doctor given that spec fails its container check. (The rendered step with pyxis's
options: tests/unit/test_containers.py; no pyxis or apptainer can be installed here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def _spec(shared_tmp: Path) -> Path:
    path = shared_tmp / "container.yaml"
    path.write_text(yaml.safe_dump({
        "name": "container", "backend": "slurm", "workdir": str(shared_tmp / "work"),
        "workload": {"framework": "torch", "params": 1000, "steps": 20},
        "resources": {"nodes": 1, "time": "00:10:00", "partition": "debug",
                      "container": {"image": "nvcr.io#nvidia/pytorch:24.05-py3"}}}))
    return path


def _faultdrill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])


def test_a_container_on_a_slurm_without_pyxis_is_refused_at_plan_and_failed_by_the_doctor(shared_tmp: Path) -> None:
    spec = _spec(shared_tmp)
    refused = _faultdrill("plan", str(spec))
    assert refused.returncode == 2, (refused.stdout, refused.stderr[-2000:])
    assert "resources.container: srun here has no --container-image" in refused.stderr, refused.stderr[-2000:]
    assert not (shared_tmp / "work").exists(), "nothing is made for a refused drill"
    done = _faultdrill("doctor", str(spec), "--format", "json")
    [container] = [check for check in json.loads(done.stdout)["checks"] if check["name"] == "container"]
    assert container["status"] == "fail" and "no pyxis plugin" in container["detail"], container
