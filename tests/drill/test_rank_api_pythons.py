"""Issue 23, item 4: the rank API in a training environment on another Python than Faultdrill's.
scripts/build-rank-api makes it a wheel of its own (faultdrill-rank, no dependency); a venv of
Python 3.9 and one of 3.13 (pyenv's, on this machine) get that wheel alone, and a drill whose
workload.python is that venv runs tests/api_trainer.py there: a rank killed, the run resumed from
its newest checkpoint, identical to its twin. CI drills 3.9; 3.13 runs with FAULTDRILL_FULL=1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from faultdrill_cli import FULL_ONLY

pytestmark = pytest.mark.drill

REPO = Path(__file__).resolve().parents[2]
PYENV = Path("/root/.pyenv/versions")
VERSIONS = ("3.9", "3.13")


def _interpreter(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.fail(f"no Python {version} here ({PYENV}): the rank API is tested on it in CI")
    return found[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = subprocess.run([str(REPO / "scripts" / "build-rank-api"), str(tmp_path_factory.mktemp("dist"))],
                           capture_output=True, text=True, timeout=300, check=True)
    return Path(built.stdout.strip().splitlines()[-1])


# CI: Python 3.9 (the oldest the rank API supports); 3.13 with FAULTDRILL_FULL=1.
@pytest.mark.parametrize("version", [VERSIONS[0], pytest.param(VERSIONS[1], marks=FULL_ONLY)])
def test_a_script_on_another_python_takes_part_through_the_rank_api_wheel(tmp_path: Path, wheel: Path,
                                                                           version: str) -> None:
    venv = tmp_path / f"venv{version}"
    subprocess.run([str(_interpreter(version)), "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", str(wheel)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    spec = {"name": f"api-py{version}", "backend": "local", "workdir": str(tmp_path / "work"),
            "workload": {"command": ["python", str(REPO / "tests" / "api_trainer.py")], "python": str(python),
                         "framework": "other", "steps": 300},
            "checkpoint": {"every_steps": 50, "keep": 2},
            "resources": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
            "faults": [{"kind": "kill-rank", "after": {"at_step": 120}, "rank": 1}],
            "restart": {"max_restarts": 2, "poll_interval_s": 0.1}, "baseline": True}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(path), "--format", "json",
                           "--no-html"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    run = next(run for run in json.loads(done.stdout)["runs"] if run["run_id"] == "r000")
    assert run["status"] == "completed" and run["identical_to_baseline"] is True, run["attempts"]
    [recovery] = run["recoveries"]
    assert recovery["resumed_from_step"] in (50, 100) and run["progress"]["source"] == "api", recovery
    logs = "".join(path.read_text() for path in (tmp_path / "work" / "runs" / "r000").rglob("*log.err"))
    assert "ModuleNotFoundError" not in logs, logs[-2000:]
    assert f"rank api: {venv}" in logs and f"on Python {version}." in logs, logs[-2000:]  # the wheel's, not the repo's
    # A rank launched by srun on two nodes finds its peers' hosts there too (helper 47: zip(strict=)
    # raised on 3.9 in the path a Slurm warm set's members take).
    hosts = subprocess.run([str(python), "-c", "from experiments.runtime.distenv import _slurm_task_hosts as h; "
                            "print(h({'SLURM_STEP_NODELIST': 'n[1-2]', 'SLURM_STEP_TASKS_PER_NODE': '2(x2)'}, 4))"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert hosts.returncode == 0 and hosts.stdout.split() == ["['n1',", "'n1',", "'n2',", "'n2']"], hosts.stderr
