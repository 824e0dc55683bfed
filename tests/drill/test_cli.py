"""The CLI as a new user meets it (issue 7, items 15-17): render per backend, every spec error
before anything is created, a version, help for everything, and a quiet exit into a closed pipe."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from drills import FAULTDRILL, write_spec
from orchestrator import cli


def _faultdrill(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FAULTDRILL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("backend,marker", [("pbs", "#PBS -N "), ("slurm", "#SBATCH --job-name="),
                                            ("local", "# local backend: no batch script")])
def test_render_shows_what_the_chosen_backend_submits(tmp_path: Path, backend: str, marker: str) -> None:
    spec = write_spec(tmp_path, backend=backend)
    done = _faultdrill("render", str(spec))
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout
    if backend == "pbs":
        assert "#SBATCH" not in done.stdout and "mpiexec -n 2" in done.stdout
    if backend == "local":
        assert "-u -m experiments.task " in done.stdout and "export FAULTDRILL_RUN_ID=r000" in done.stdout
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("overrides,message", [
    ({"faults": [{"kind": "kill-rank", "rank": 5}]}, "faults: fault 0 targets rank 5, but a run has ranks 0..1"),
    ({"sweep": {"grid": {"workload.paramz": [1000, 2000]}}}, "no key 'paramz' at workload; valid:"),
    ({"sweep": {"grid": {"workload.steps": [10, -1]}}}, "workload.steps: Input should be greater than or equal to 1"),
    ({"sweep": {"grid": {"resources.tasks_per_node": [2, 1]}},
      "faults": [{"kind": "kill-rank", "rank": 1}]}, "targets rank 1, but a run has ranks 0..0"),
])
def test_errors_found_while_expanding_or_planning_create_nothing(tmp_path: Path, overrides: dict, message: str) -> None:
    spec = write_spec(tmp_path, **overrides)
    for command in ("drill", "validate"):
        done = _faultdrill(command, str(spec))
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "work").exists(), "a bad spec left a workdir behind"


def test_every_bad_field_is_reported_at_once_without_pydantic_noise(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, workdir=str(tmp_path / "no" / "such" / "work"),
                      workload={"framework": "jax", "steps": "many"}, restart={"hang_timeout_s": -1})
    done = _faultdrill("drill", str(spec))
    assert done.returncode == 2
    for expected in ("workdir: parent directory", "workload.framework: unknown framework 'jax'",
                     "workload.steps", "restart.hang_timeout_s"):
        assert expected in done.stderr, done.stderr
    assert "Value error," not in done.stderr
    assert "(got 'jax')" not in done.stderr  # the message names the value already


def test_a_spec_that_is_not_utf8_text_gets_a_clean_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"name: caf\xe9\nbackend: local\n")
    done = _faultdrill("validate", str(spec))
    assert done.returncode == 2 and "not UTF-8 text (byte 0xe9 at offset 9)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("directive", ["-A ml", "--account ml", "--comment=a b"])
def test_extra_directives_with_a_value_are_emitted_as_sbatch_parses_them(tmp_path: Path, directive: str) -> None:
    spec = write_spec(tmp_path, backend="slurm", resources={"nodes": 1, "tasks_per_node": 2,
                                                           "extra_directives": [directive]})
    done = _faultdrill("render", str(spec))
    expected = {"-A ml": "#SBATCH -A ml", "--account ml": "#SBATCH --account=ml",
                "--comment=a b": '#SBATCH --comment="a b"'}[directive]
    assert expected in done.stdout.splitlines(), done.stdout


def test_directives_faultdrill_sets_itself_are_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, backend="slurm", resources={"nodes": 1, "tasks_per_node": 2,
                                                           "extra_directives": ["--requeue", "-J mine"]})
    done = _faultdrill("validate", str(spec))
    assert done.returncode == 2
    assert "--requeue is set by Faultdrill on slurm" in done.stderr and "-J is set by Faultdrill" in done.stderr


def test_version_and_a_help_line_for_every_command_and_argument() -> None:
    done = _faultdrill("--version")
    assert done.returncode == 0 and done.stdout.startswith("faultdrill 0.")
    parser = cli._parser()
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for choice in commands._choices_actions:
        assert choice.help, f"subcommand {choice.dest} has no help"
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"'faultdrill {name}' argument {action.dest} has no help"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, backend="slurm", sweep={"grid": {"workload.seed": list(range(40))}})
    render = subprocess.Popen([*FAULTDRILL, "render", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert render.stdout is not None and render.stderr is not None
    render.stdout.readline()
    render.stdout.close()  # `faultdrill render SPEC | head -1`
    errors = render.stderr.read().decode()
    assert render.wait(timeout=60) == cli.EXIT_PIPE
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
