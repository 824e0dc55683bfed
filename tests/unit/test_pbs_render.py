"""The PBS batch script: golden files (Torque, PBS Pro array, hostile path), quoting, and the job id
the script computes agreeing with the plugin's job environment under every PBS flavour."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.backends.pbs.commands import array_element_id, output_options
from orchestrator.backends.pbs.plugin import PBSJobEnvironment
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import Campaign
from orchestrator.render.scripts import (
    TemplateError,
    pbs_directive,
    pbs_walltime,
    render_pbs,
    render_pbs_array,
    render_template,
)

GOLDEN = Path(__file__).parent / "golden"
PYTHON = "/opt/faultdrill/.venv/bin/python"
HOSTILE = "/data/it's a \"drill\" $HOME `x`\nsecond line"


@pytest.fixture(autouse=True)
def _no_site_libmpi_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site's MPI4PY_LIBMPI in the shell that runs the tests would reach the ranks as it is, and
    the scripts would not say MPI4PY_LIBMPI='' (orchestrator/campaign/mpi.py)."""
    monkeypatch.delenv("MPI4PY_LIBMPI", raising=False)


def _campaign(workdir: str, grid: dict[str, list[object]] | None = None, **resources: object) -> Campaign:
    return Campaign.model_validate({
        "name": "golden",
        "backend": "pbs",
        "workdir": workdir,
        "workload": {"framework": "torch", "params": 20000, "steps": 40},
        "resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:10:00", **resources},
        "sweep": {"grid": grid or {}},
    })


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FAULTDRILL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"rendered script differs from {path} (FAULTDRILL_UPDATE_GOLDEN=1 rewrites)"


def _directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#PBS")]


@pytest.mark.drill
def test_torque_script_matches_golden() -> None:
    run = expand_runs(_campaign("/scratch/drills/golden", partition="debug",
                                extra_directives=["-l mem=4gb", "-A fault drill", "-V"]))[0]
    script = render_pbs(run, attempt=1, drill_id="golden-0001", python=PYTHON)
    _check_golden("pbs_torque_basic.pbs", script.text)
    assert script.submit_dir == Path("/scratch/drills/golden/runs/r000/submitit")
    assert script.environment["SUBMITIT_EXECUTOR"] == "pbs"
    subprocess.run(["bash", "-n"], input=script.text, text=True, check=True)


@pytest.mark.drill
def test_pro_array_matches_golden() -> None:
    runs = expand_runs(_campaign("/scratch/drills/golden", {"workload.seed": [1, 2, 3]}, pbs_flavor="pro"))
    script = render_pbs_array([(run, 0) for run in runs], "golden-0003", "fd-golden-sweep", 2, PYTHON)
    _check_golden("pbs_pro_array.pbs", script.text)
    directives = _directives(script.text)
    assert "#PBS -l select=2:ncpus=2:mpiprocs=2" in directives
    # Real-sites issue, item 10: without place=scatter PBS Pro may put two chunks on one node
    # (place=free is its default), and the launch's ranks-per-node layout is then wrong.
    assert "#PBS -l place=scatter" in directives
    assert "#PBS -J 0-2%2" in directives
    subprocess.run(["bash", "-n"], input=script.text, text=True, check=True)


@pytest.mark.drill
def test_in_allocation_launches_mpiexec_again_on_the_controllers_go() -> None:
    campaign = _campaign("/scratch/drills/golden").model_copy(
        update={"restart": _campaign("/w").restart.model_copy(update={"strategy": "in-allocation",
                                                                       "relaunch_wait_s": 45})})
    text = render_pbs(expand_runs(campaign)[0], attempt=0, drill_id="golden-0001", python=PYTHON).text
    launch = text.split("launch_ranks() {")[1].split("\n}\n")[0]
    assert "mpiexec -n 4" in launch and launch.strip().endswith("launch_pid=$!")
    assert '"$folder" &' in launch, "mpiexec runs in the background"
    assert "waited_until=$(( SECONDS + 45 ))" in text and 'export FAULTDRILL_ATTEMPT="$attempt"' in text
    assert 'attempts_root=$(dirname -- "$(dirname -- "$events")")' in text
    assert text.count('"event": "step_exit"') == 1, "one step_exit per launch, from the relaunch loop"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


@pytest.mark.parametrize("framework, spares_per_node, sets_flags", [
    ("torch", 2, None),  # one mpiexec per rank and per spare
    ("tensorflow", 4, "--restart-all --spare-sets 2 \\"),  # whole sets: 2 sets of 2 a node, one mpiexec each
    ("chainer", 4, "--restart-all --spare-sets 2 \\"),
])
@pytest.mark.drill
def test_warm_runs_the_coordinator_with_mpiexec_and_the_spares_cpus(framework: str, spares_per_node: int,
                                                                    sets_flags: str | None) -> None:
    campaign = Campaign.model_validate({
        "name": "golden", "backend": "pbs", "workdir": "/w",
        "workload": {"framework": framework, "params": 20000, "steps": 40},
        "resources": {"nodes": 2, "tasks_per_node": 2, "time": "00:10:00"},
        "restart": {"strategy": "warm", "warm_spares": 2},
    })
    text = render_pbs(expand_runs(campaign)[0], attempt=0, drill_id="d", python=PYTHON).text
    assert f"#PBS -l nodes=2:ppn={2 + spares_per_node}" in _directives(text), "the spares' CPUs are the job's"
    launch = text.split("-m experiments.warm.batch_host ", 1)[1].split("launch_pid=$!")[0]
    assert launch.startswith("--launcher mpiexec ") and "--ranks-per-node 2 --spares-per-node" in launch
    assert f"--spares-per-node {spares_per_node} " in launch
    forwarded = launch.split("--forward ", 1)[1].split()[0].strip("'").split(",")
    for name in ("FAULTDRILL_RUN_ID", "FAULTDRILL_RUN_DIR", "FAULTDRILL_MASTER_ADDR", "FAULTDRILL_WARM_WORLD"):
        assert name in forwarded, "every member's mpiexec exports these (-x)"
    assert ("--restart-all" in launch) == (sets_flags is not None) and "--mpi" not in launch
    assert "\nmpiexec -n" not in text, "no launch of all ranks besides the coordinator's"
    # every member runs the task command of every other launch: submitit's runner loads NumPy (and
    # OpenBLAS's threads) before the rank's thread limits, and a faulted run then trained other
    # arithmetic than its twin (CI: Chainer's loss differed in its last bit from step 4)
    assert launch.split(" -- ", 1)[1].split(" &")[0] == f'{PYTHON} -u -m experiments.task "$folder"'
    assert text.count('"event": "step_exit"') == 1
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


@pytest.mark.drill
def test_hostile_workdir_matches_golden_and_survives_the_shell() -> None:
    run = expand_runs(_campaign(HOSTILE))[0]
    script = render_pbs(run, attempt=0, drill_id="golden-0002", python=PYTHON)
    _check_golden("pbs_hostile_path.pbs", script.text)
    assert not any("it's" in line or "$HOME" in line for line in _directives(script.text))
    subprocess.run(["bash", "-n"], input=script.text, text=True, check=True)
    environment_part = script.text.split("\nfolder=${folder")[0]  # directives are comments to bash
    shown = subprocess.run(
        ["bash", "-c", environment_part + '\nprintf "%s|%s" "$FAULTDRILL_RUN_DIR" "$folder"'],
        capture_output=True, text=True, check=True, env={"PBS_JOBID": "7.server", "PATH": os.environ["PATH"]},
    ).stdout
    assert shown == f"{HOSTILE}/runs/r000|{HOSTILE}/runs/r000/submitit"


def test_directives_come_in_a_stable_order() -> None:
    run = expand_runs(_campaign("/w", partition="p"))[0]
    first = render_pbs(run, 0, "d", PYTHON).text
    assert first == render_pbs(run, 0, "d", PYTHON).text
    flags = [" ".join(line.split()[:3]).split("=")[0] for line in _directives(first)]
    assert flags == ["#PBS -N fd-d-r000-a0", "#PBS -l nodes", "#PBS -l walltime", "#PBS -q p",
                     "#PBS -o fd-d-r000-a0.pbs.out", "#PBS -e fd-d-r000-a0.pbs.err", "#PBS -r n"]


def test_rank_launch_is_one_mpiexec_that_ends_when_a_rank_dies() -> None:
    text = render_pbs(expand_runs(_campaign("/w"))[0], 0, "d", PYTHON).text
    launch = text.split("\nmpiexec ", 1)[1].split("launch_pid=$!")[0]
    assert launch.startswith("-n 4 --map-by ppr:2:node") and "odls_base_sigkill_timeout 0" in launch
    for name in ("FAULTDRILL_RUN_ID", "FAULTDRILL_RUN_DIR", "FAULTDRILL_MASTER_ADDR", "SUBMITIT_EXECUTOR"):
        assert f"-x {name} " in launch
    assert "experiments.task" in launch


def test_user_template_can_replace_the_launch_block(tmp_path: Path) -> None:
    template = tmp_path / "site.pbs.j2"
    template.write_text('{% extends "pbs.j2" %}\n{% block launch %}\npbsdsh -v -- true\nrc=$?\n{% endblock %}\n')
    campaign = _campaign("/w").model_copy(update={"template": template})
    text = render_pbs(expand_runs(campaign)[0], 0, "d", PYTHON).text
    assert "pbsdsh -v -- true" in text and "mpiexec -n" not in text
    assert "#PBS -l nodes=2:ppn=2" in text


def test_array_needs_runs_with_the_same_resources() -> None:
    runs = expand_runs(_campaign("/w", {"resources.nodes": [1, 2]}))
    with pytest.raises(TemplateError, match="other resources"):
        render_pbs_array([(run, 0) for run in runs], "d", "fd-x", 4, PYTHON)


def test_walltime_and_directive_helpers() -> None:
    assert pbs_walltime("00:10:00") == "00:10:00"
    assert pbs_walltime("1-02:03:04") == "26:03:04"
    assert pbs_walltime("90") == "01:30:00"
    assert pbs_directive("-l mem=4gb") == ("-l", "mem=4gb")
    assert pbs_directive("-lsoftware=x") == ("-l", "software=x")
    assert pbs_directive("-V") == ("-V", "")
    with pytest.raises(TemplateError, match="one-letter option"):
        pbs_directive("--exclusive")


def test_strict_undefined_names_the_missing_variable() -> None:
    with pytest.raises(TemplateError, match="job_name"):
        render_template("pbs.j2", {})


def test_output_paths_are_repeated_for_qsub_and_checked() -> None:
    text = render_pbs(expand_runs(_campaign("/w"))[0], 0, "d", PYTHON).text
    assert output_options(text) == ["-o", "fd-d-r000-a0.pbs.out", "-e", "fd-d-r000-a0.pbs.err"]
    with pytest.raises(ValueError, match="not safe"):
        output_options("#!/bin/bash\n#PBS -o $(reboot)\n")


# The job id the batch script computes must be the plugin's JobEnvironment.job_id and the login
# side's id for the same job, or the ranks would look for the wrong pickles.
JOB_ID_CASES = [
    ({"PBS_JOBID": "123.server"}, "123.server"),
    ({"PBS_JOBID": "123[4].server", "PBS_ARRAYID": "4"}, array_element_id("123[].server", 4)),
    ({"PBS_JOBID": "123[4].server", "PBS_ARRAY_INDEX": "4", "PBS_ARRAY_ID": "123[].server"},
     array_element_id("123[].server", 4)),
    ({"PBS_JOBID": "", "SLURM_JOB_ID": "68"}, "68"),
    ({"PBS_JOBID": "", "SLURM_JOB_ID": "73", "SLURM_ARRAY_JOB_ID": "69", "SLURM_ARRAY_TASK_ID": "4"},
     array_element_id("69", 4)),
]


@pytest.mark.parametrize(("environ", "expected"), JOB_ID_CASES)
@pytest.mark.drill
def test_script_and_job_environment_agree_on_the_job_id(
    environ: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = render_pbs(expand_runs(_campaign("/w"))[0], 0, "d", PYTHON).text
    block = text.split("set -u\n", 1)[1].split("\nexport ", 1)[0]
    shown = subprocess.run(["bash", "-c", block + '\nprintf %s "$job_id"'], capture_output=True, text=True,
                           check=True, env={"PATH": os.environ["PATH"], **environ}).stdout
    assert shown == expected
    for name in ("PBS_JOBID", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert PBSJobEnvironment().job_id == expected


def _ompi_tmp_statement(script: str) -> str:
    """The script's `ompi_tmp=$(mktemp ...) || { ...; }` statement, its continuation lines included."""
    lines = script.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("ompi_tmp="))
    end = next(index for index in range(start, len(lines)) if lines[index].rstrip().endswith("}"))
    return "\n".join(lines[start:end + 1])


@pytest.mark.drill
def test_the_open_mpi_session_directory_is_a_private_one_of_a_random_name(tmp_path: Path) -> None:
    """Security issue 28, item 4: /tmp/faultdrill-ompi-<job id> was a name another user of the node
    could create first (the attempt failed on a 0755 one, or its session lived in a 0777 one)."""
    run = expand_runs(_campaign("/scratch/drills/ompi"))[0]
    statement = _ompi_tmp_statement(render_pbs(run, attempt=0, drill_id="d1", python=PYTHON).text)
    made = [subprocess.run(["bash", "-c", f'{statement}\necho "$ompi_tmp"'],
                           env={**os.environ, "TMPDIR": str(tmp_path)},
                           capture_output=True, text=True, check=True).stdout.strip() for _ in range(2)]
    assert made[0] != made[1] and all(Path(path).parent == tmp_path for path in made), made
    assert all(os.stat(path).st_mode & 0o777 == 0o700 for path in made)
    squatted = tmp_path / "faultdrill-ompi-7.server"  # what the old name would have been: not used
    assert not squatted.exists() and all("7.server" not in path for path in made)


@pytest.mark.drill
def test_no_open_mpi_session_directory_ends_the_job_with_a_reason(tmp_path: Path) -> None:
    """mktemp -d failing (a TMPDIR that does not exist, a full /tmp) must end the script with a message
    that names it, not launch mpiexec with an empty --mca orte_tmpdir_base."""
    run = expand_runs(_campaign("/scratch/drills/ompi"))[0]
    statement = _ompi_tmp_statement(render_pbs(run, attempt=0, drill_id="d1", python=PYTHON).text)
    missing = tmp_path / "no-such-dir"
    result = subprocess.run(["bash", "-c", f'{statement}\necho launched'], env={**os.environ, "TMPDIR": str(missing)},
                            capture_output=True, text=True)
    assert result.returncode == 1 and "launched" not in result.stdout
    assert f"mktemp -d failed in {missing}" in result.stderr


def test_gpus_per_node_is_asked_in_each_schedulers_own_words() -> None:
    """Review of issue 22 (item 9): PBS never got ngpus. resources.gpus_per_node renders as PBS Pro's
    select ngpus, Torque's nodes gpus and Slurm's --gres=gpu:N; a GPU directive besides it is refused."""
    from orchestrator.campaign.spec import SpecError, parse_campaign
    from orchestrator.render.scripts import render_slurm

    pro = render_pbs(expand_runs(_campaign("/scratch/g", pbs_flavor="pro", gpus_per_node=4))[0], 0, "g", PYTHON)
    assert "#PBS -l select=2:ncpus=2:mpiprocs=2:ngpus=4" in _directives(pro.text), _directives(pro.text)
    torque = render_pbs(expand_runs(_campaign("/scratch/g", gpus_per_node=4))[0], 0, "g", PYTHON)
    assert "#PBS -l nodes=2:ppn=2:gpus=4" in _directives(torque.text), _directives(torque.text)
    slurm_spec = {"name": "g", "backend": "slurm", "workdir": "/tmp/g", "workload": {"framework": "torch"},
                  "resources": {"nodes": 2, "gpus_per_node": 4}}
    slurm = render_slurm(expand_runs(parse_campaign(slurm_spec, base_dir=Path("/"))
                          )[0], 0, "g", PYTHON)
    assert "#SBATCH --gres=gpu:4" in slurm.text.splitlines(), slurm.text[:600]
    without = render_slurm(expand_runs(parse_campaign({**slurm_spec, "resources": {"nodes": 2}}, base_dir=Path("/")))[0], 0, "g", PYTHON)
    assert "--gres" not in without.text
    twice = {**slurm_spec, "resources": {"nodes": 2, "gpus_per_node": 4, "extra_directives": ["--gres=gpu:4"]}}
    with pytest.raises(SpecError, match="say it once"):
        parse_campaign(twice, base_dir=Path("/"))


def test_workload_setup_lines_run_before_the_launch_and_pbs_passes_their_environment_on() -> None:
    """Issue 23, item 4: `module load` / `conda activate` lines (workload.setup) in the batch script
    before the ranks' launch, `set -u` off around them, a failing line named; on PBS mpiexec passes
    on the variables a set-up changes (-x PATH ...); the local backend refuses them."""
    from orchestrator.campaign.spec import SpecError, parse_campaign
    from orchestrator.render.scripts import SETUP_FORWARDED, render_slurm

    setup = ["module load cuda/12.2", "source /opt/venvs/train/bin/activate"]
    spec = {"name": "s", "backend": "slurm", "workdir": "/tmp/s", "workload": {"framework": "torch", "setup": setup}}
    slurm = render_slurm(expand_runs(parse_campaign(spec, base_dir=Path("/")))[0], 0, "s", PYTHON).text
    block = slurm.split("# workload.setup", 1)[1]
    assert block.index("{\nmodule load cuda/12.2\n} ||") < block.index("{\nsource /opt/venvs/train/bin/activate\n} ||")
    assert "set +u" in block.split("module load", 1)[0] and "srun" in block.split("set -u", 1)[1], block[:400]
    assert "workload.setup line 1 failed" in block
    pbs = render_pbs(expand_runs(parse_campaign({**spec, "backend": "pbs"}, base_dir=Path("/")))[0], 0, "s", PYTHON).text
    assert "module load cuda/12.2\n} ||" in pbs and all(f"-x {name}" in pbs for name in SETUP_FORWARDED)
    assert pbs.index("module load cuda") < pbs.index("mpiexec -n")
    plain = render_pbs(expand_runs(_campaign("/scratch/g"))[0], 0, "g", PYTHON).text
    assert "workload.setup" not in plain and "-x VIRTUAL_ENV" not in plain
    with pytest.raises(SpecError, match="workload.setup: lines of a batch script"):
        parse_campaign({**spec, "backend": "local"}, base_dir=Path("/"))


@pytest.mark.drill
def test_a_setup_line_that_fails_stops_the_job_even_with_a_trailing_comment(tmp_path: Path) -> None:
    """Review of issue 23: `false  # the team's env` rendered as `false  # ... || { exit 1; }`: the
    check inside the comment, the job went on. Each line now runs in a group of its own."""
    from orchestrator.campaign.spec import parse_campaign
    from orchestrator.render.scripts import render_slurm

    setup = ["export FD_SETUP=1", "false  # the team's env", "echo not reached"]
    spec = {"name": "s", "backend": "slurm", "workdir": str(tmp_path / "w"),
            "workload": {"framework": "torch", "setup": setup}}
    text = render_slurm(expand_runs(parse_campaign(spec, base_dir=tmp_path))[0], 0, "s", PYTHON).text
    block = "set -u\n" + text.split("# workload.setup (the spec's own lines)\n", 1)[1].split("\nset -u\n", 1)[0]
    done = subprocess.run(["bash", "-c", block + "\nset -u\necho REACHED THE LAUNCH"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and "REACHED" not in done.stdout and "not reached" not in done.stdout, done
    assert "workload.setup line 2 failed: false  # the team's env" in done.stderr, done.stderr
