"""Issue 22 item 7: the ranks in a container. Slurm's pyxis plugin (``resources.container``): the
ranks' step gets ``--container-image`` and the mounts the rank runtime needs at the same paths; a
site whose srun has no pyxis is refused at plan; on PBS and the local backend, and with the warm
strategy, the spec is refused with what to do instead. (Apptainer is started in workload.command:
tests/drill/test_injector_targets.py verifies such a rank through its supervisor.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.slurm.site import container_refusals
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.render.scripts import REPO, render_slurm

pytestmark = pytest.mark.unit

PYTHON = "/opt/fd/.venv/bin/python"
CONTAINER = {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/datasets:/data:ro"], "workdir": "/data"}


def _spec(tmp_path: Path, **overrides: object) -> dict:
    spec = {"name": "c", "backend": "slurm", "workdir": str(tmp_path / "work"),
            "workload": {"framework": "torch", "params": 1000, "steps": 10},
            "checkpoint": {"every_steps": 5, "directory": "/scratch/me/ckpt/{run_id}"},
            "resources": {"nodes": 2, "time": "00:10:00", "container": CONTAINER}}
    spec.update(overrides)
    return spec


@pytest.mark.parametrize("strategy", ["resubmit", "in-allocation"])
def test_the_ranks_step_runs_in_the_image_with_what_the_runtime_needs_mounted(tmp_path: Path, strategy: str) -> None:
    [run] = expand_runs(parse_campaign(_spec(tmp_path, restart={"strategy": strategy}), base_dir=tmp_path))
    text = render_slurm(run, 0, "d", PYTHON).text.replace("\\\n", " ")  # the launch's continued lines as one
    [launch] = [line for line in text.splitlines() if "experiments.task" in line and line.lstrip().startswith("srun")]
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in launch and "--container-workdir=/data" in launch
    mounts = launch.split("--container-mounts=")[1].split()[0].split(",")
    for path in (REPO, Path("/opt/fd/.venv"), tmp_path / "work", Path("/scratch/me/ckpt")):
        assert f"{path}:{path}" in mounts, mounts
    assert mounts[-1] == "/datasets:/data:ro", "the spec's own mounts after the runtime's"
    assert launch.index("--container-image") < launch.index(PYTHON), "srun's options before the command"


def test_without_a_container_the_ranks_step_has_no_container_options(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["resources"] = {"nodes": 2, "time": "00:10:00"}
    [run] = expand_runs(parse_campaign(spec, base_dir=tmp_path))
    assert "--container" not in render_slurm(run, 0, "d", PYTHON).text


@pytest.mark.parametrize("change, said", [
    ({"backend": "pbs"}, "pyxis is a Slurm plugin, not on the pbs backend"),
    ({"backend": "local", "resources": {"nodes": 1, "container": CONTAINER}}, "apptainer exec"),
    ({"restart": {"strategy": "warm"}}, "not in a container yet"),
    ({"resources": {"nodes": 2, "container": {"image": "a b"}}}, "one word"),
    ({"resources": {"nodes": 2, "container": {"image": "img", "mounts": ["/a:/b,/c:/d"]}}}, "SRC[:DST[:FLAGS]]"),
    ({"resources": {"nodes": 2, "container": {"image": "img", "mounts": [":/b"]}}}, "SRC[:DST[:FLAGS]]"),
])
def test_a_container_the_spec_cannot_have_is_refused_with_what_is_valid(tmp_path: Path, change: dict, said: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_campaign(_spec(tmp_path, **change), base_dir=tmp_path)
    assert said in str(refused.value), str(refused.value)


def test_a_slurm_without_pyxis_is_told_at_plan(tmp_path: Path) -> None:
    """``srun --help`` lists a SPANK plugin's options: recorded without and with pyxis (0.20)."""
    runs = expand_runs(parse_campaign(_spec(tmp_path), base_dir=tmp_path))
    plain = "Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]\n      --mpi=type   type of MPI being used\n"
    pyxis = plain + ("Options provided by plugins:\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
                     "                              [pyxis] the image to use for the container\n")
    [refusal] = container_refusals(runs, plain)
    assert "no --container-image" in refusal and "pyxis" in refusal
    assert container_refusals(runs, pyxis) == []
    spec = _spec(tmp_path)
    spec["resources"] = {"nodes": 2, "time": "00:10:00"}
    assert container_refusals(expand_runs(parse_campaign(spec, base_dir=tmp_path)), plain) == []
