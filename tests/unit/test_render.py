"""Rendered batch scripts: golden files, quoting of hostile paths, strict variables, user templates."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.render.scripts import TemplateError, directive_value, render_slurm, render_template

GOLDEN = Path(__file__).parent / "golden"
PYTHON = "/opt/faultdrill/.venv/bin/python"
HOSTILE = "/data/it's a \"drill\" $HOME `x`\nsecond line"


def _campaign(workdir: str, **resources: object) -> Campaign:
    return Campaign.model_validate({
        "name": "golden",
        "backend": "slurm",
        "workdir": workdir,
        "workload": {"framework": "torch", "params": 20000, "steps": 40},
        "resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:10:00", **resources},
    })


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FAULTDRILL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"rendered script differs from {path} (FAULTDRILL_UPDATE_GOLDEN=1 rewrites)"


def test_slurm_script_matches_golden() -> None:
    run = expand_runs(_campaign("/scratch/drills/golden", partition="debug",
                                extra_directives=["--exclusive", "--comment=fault drill"]))[0]
    script = render_slurm(run, attempt=1, drill_id="golden-0001", python=PYTHON)
    _check_golden("slurm_basic.sbatch", script.text)
    assert script.submit_dir == Path("/scratch/drills/golden/runs/r000/submitit")


def test_nodes_an_earlier_attempt_lost_are_excluded() -> None:
    run = expand_runs(_campaign("/scratch/drills/golden", partition="debug"))[0]
    script = render_slurm(run, attempt=2, drill_id="golden-0001", python=PYTHON, exclude_nodes=("fd-n2", "fd-n3"))
    assert "#SBATCH --exclude=fd-n2,fd-n3\n" in script.text
    assert "--exclude" not in render_slurm(run, attempt=2, drill_id="golden-0001", python=PYTHON).text


@pytest.mark.drill
def test_hostile_workdir_matches_golden_and_survives_the_shell() -> None:
    run = expand_runs(_campaign(HOSTILE))[0]
    script = render_slurm(run, attempt=0, drill_id="golden-0002", python=PYTHON)
    _check_golden("slurm_hostile_path.sbatch", script.text)
    assert HOSTILE not in "".join(line for line in script.text.splitlines() if line.startswith("#SBATCH"))
    subprocess.run(["bash", "-n"], input=script.text, text=True, check=True)
    environment_part = script.text.split("\nevents=")[0]  # directives are comments to bash
    shown = subprocess.run(["bash", "-c", environment_part + '\nprintf %s "$FAULTDRILL_RUN_DIR"'],
                           capture_output=True, text=True, check=True, env={**os.environ, "SLURM_JOB_ID": "7"}).stdout
    assert shown == f"{HOSTILE}/runs/r000"


def test_directives_are_stable_and_ordered() -> None:
    run = expand_runs(_campaign("/w", partition="p"))[0]
    first = render_slurm(run, 0, "d", PYTHON).text
    assert first == render_slurm(run, 0, "d", PYTHON).text
    directives = [line.split("=")[0] for line in first.splitlines() if line.startswith("#SBATCH")]
    assert directives[:5] == ["#SBATCH --job-name", "#SBATCH --nodes", "#SBATCH --ntasks-per-node",
                              "#SBATCH --time", "#SBATCH --partition"]


def test_rank_launch_kills_the_step_when_a_rank_dies() -> None:
    text = render_slurm(expand_runs(_campaign("/w"))[0], 0, "d", PYTHON).text
    assert "srun --kill-on-bad-exit=1" in text
    assert "experiments.task" in text


def test_directive_values_reject_line_breaks_and_quote_blanks() -> None:
    assert directive_value("debug") == "debug"
    assert directive_value("a b") == '"a b"'
    with pytest.raises(TemplateError, match="line break"):
        directive_value("a\nb")


def test_strict_undefined_names_the_missing_variable(tmp_path: Path) -> None:
    template = tmp_path / "mine.j2"
    template.write_text("#!/bin/bash\necho {{ not_provided | q }}\n")
    with pytest.raises(TemplateError, match="not_provided"):
        render_template("ignored", {"job_name": "x"}, template)


def test_user_template_override_by_path(tmp_path: Path) -> None:
    template = tmp_path / "site.sbatch.j2"
    template.write_text('{% extends "slurm.sbatch.j2" %}\n{% block launch %}\n# site launch\nrc=0\n{% endblock %}\n')
    campaign = _campaign("/w").model_copy(update={"template": template})
    text = render_slurm(expand_runs(campaign)[0], 0, "d", PYTHON).text
    assert "# site launch" in text and "srun --kill-on-bad-exit" not in text
    assert "#SBATCH --nodes=2" in text


@pytest.mark.drill
def test_in_allocation_keeps_the_allocation_and_relaunches_on_the_controllers_go(tmp_path: Path) -> None:
    campaign = Campaign.model_validate({
        "name": "golden", "backend": "slurm", "workdir": "/scratch/drills/golden",
        "workload": {"framework": "torch", "params": 20000, "steps": 40},
        "resources": {"nodes": 2, "tasks_per_node": 2, "spare_nodes": 1},
        "restart": {"strategy": "in-allocation", "relaunch_wait_s": 45},
    })
    text = render_slurm(expand_runs(campaign)[0], attempt=0, drill_id="golden-0001", python=PYTHON).text
    assert "#SBATCH --nodes=3\n" in text, "the allocation holds the spare node"
    assert "#SBATCH --no-kill\n" in text, "a node that fails does not end the job"
    assert "--overlap --nodes=2 --ntasks=4" in text, "the ranks' step uses 2 of the 3 nodes"
    assert "--kill-on-bad-exit=1" in text.split("launch_ranks() {")[1], "one dead rank ends the step"
    assert "waited_until=$(( SECONDS + 45 ))" in text and 'export FAULTDRILL_ATTEMPT="$attempt"' in text
    assert '--job-name=faultdrill-ranks-"$attempt"' in text, "each attempt's step has a name of its own"
    script = tmp_path / "in-allocation.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


@pytest.mark.parametrize("framework, sets_flags", [
    ("torch", None),  # one step per rank and per spare
    ("tensorflow", "--restart-all --spare-sets 2 \\"),  # whole sets, one step each
    ("chainer", "--restart-all --spare-sets 2 --mpi pmix \\"),  # each set an MPI world of its own
])
@pytest.mark.drill
def test_warm_runs_the_coordinator_with_the_spares_task_slots(tmp_path: Path, framework: str,
                                                               sets_flags: str | None) -> None:
    campaign = Campaign.model_validate({
        "name": "golden", "backend": "slurm", "workdir": "/scratch/drills/golden",
        "workload": {"framework": framework, "params": 20000, "steps": 40},
        "resources": {"nodes": 2, "tasks_per_node": 2},
        "restart": {"strategy": "warm", "warm_spares": 2},
    })
    text = render_slurm(expand_runs(campaign)[0], attempt=0, drill_id="golden-0001", python=PYTHON).text
    # torch: 2 ranks + 2 spares a node; TensorFlow, Chainer: 2 ranks + 2 sets of 2 a node
    assert f"#SBATCH --ntasks-per-node={4 if framework == 'torch' else 6}\n" in text, text
    assert "-m experiments.warm.batch_host --launcher srun" in text and "--ranks-per-node 2" in text
    members = text.split("-m experiments.warm.batch_host ", 1)[1].split("\nrc=$?")[0]
    assert members.split(" -- ", 1)[1] == f'{PYTHON} -u -m experiments.task "$folder"', "the task command"
    if sets_flags is None:
        assert "--restart-all" not in text
    else:
        assert f"\n  {sets_flags}\n" in text, text
    script = tmp_path / "warm.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


@pytest.mark.parametrize("restart,tasks,relaunch_wait", [
    ({"strategy": "warm", "warm_spares": 1}, 3, False),  # 2 ranks and the spare: what submit() starts
    ({"strategy": "in-allocation", "relaunch_wait_s": 45}, 2, True),  # the relaunch's wait goes with it
    ({}, 2, False)])
def test_the_local_render_shows_the_tasks_and_environment_that_submit_starts(
        tmp_path: Path, restart: dict[str, object], tasks: int, relaunch_wait: bool) -> None:
    from orchestrator.backends.local.backend import describe_local

    campaign = Campaign.model_validate({
        "name": "local", "backend": "local", "workdir": str(tmp_path / "work"), "restart": restart,
        "workload": {"framework": "torch", "params": 20000, "steps": 40},
        "resources": {"nodes": 1, "tasks_per_node": 2}})
    shown = describe_local(expand_runs(campaign)[0], attempt=0, drill_id="d-1")
    assert f"# {tasks} task(s) of this command" in shown
    assert ("export FAULTDRILL_RELAUNCH_WAIT_S=45" in shown) is relaunch_wait
    assert shown.rstrip().endswith(f"-u -m experiments.task {tmp_path / 'work' / 'runs' / 'r000' / 'submitit'}")
