"""Issue 27, item 1: a command under torchrun. How the command is split into torchrun and the script,
what the spec refuses, what the batch scripts launch, how a worker knows its place, and how torchrun's
summary of a failed worker becomes the rank's end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from experiments.runtime.distenv import DistEnv
from experiments.runtime.torchrun import ELASTIC_ENV, root_cause_exit, torchrun_argv
from orchestrator.campaign.runs import RunConfig, expand_runs
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.campaign.torchrun import TORCHRUN_MODULE, TorchrunError, split_torchrun, starts_torchrun
from orchestrator.render.scripts import render_slurm

PY = sys.executable


def _run(tmp_path: Path, command: list[str], nodes: int = 1, per_node: int = 2, **workload: object) -> RunConfig:
    raw = {"name": "tr", "backend": "slurm", "workdir": str(tmp_path / "work"),
           "workload": {"framework": "torch", "steps": 50, "command": command, **workload},
           "resources": {"nodes": nodes, "tasks_per_node": per_node}}
    [run] = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    return run


@pytest.mark.parametrize(("argv", "program", "options", "script"), [
    (["torchrun", "--nproc-per-node=2", "train.py", "--lr", "0.1"], (PY, "-m", TORCHRUN_MODULE), (),
     ("train.py", "--lr", "0.1")),
    (["/opt/bin/torchrun", "--nproc_per_node", "2", "--log-dir", "logs", "--standalone", "-m", "pkg.train"],
     ("/opt/bin/torchrun",), ("--log-dir=logs",), ("-m", "pkg.train")),
    ([PY, "-m", TORCHRUN_MODULE, "--nnodes=1", "--max-restarts=3", "--monitor-interval", "1", "t.py"],
     (PY, "-m", TORCHRUN_MODULE), ("--monitor-interval=1",), ("t.py",)),
    # launcher: torchrun with the script alone: Python's, or a program of its own
    (["python", "train.py", "x"], (PY, "-m", TORCHRUN_MODULE), (), ("train.py", "x")),
    (["train.py"], (PY, "-m", TORCHRUN_MODULE), (), ("train.py",)),
    (["./train.sh", "a"], (PY, "-m", TORCHRUN_MODULE), (), ("--no-python", "./train.sh", "a")),
])
def test_the_command_splits_into_torchrun_its_kept_options_and_the_script(
        argv: list[str], program: tuple[str, ...], options: tuple[str, ...], script: tuple[str, ...]) -> None:
    """Faultdrill's options (placement, rendezvous, restarts) are dropped: the rank side writes them."""
    split = split_torchrun(argv, PY, nodes=1, per_node=2)
    assert (split.program, split.options, split.script) == (program, options, script)


@pytest.mark.parametrize(("argv", "expected"), [
    (["torchrun", "--nproc-per-node=4", "t.py"], "torchrun --nproc-per-node=4, but resources.tasks_per_node is 2"),
    (["torchrun", "--nnodes", "3", "t.py"], "torchrun --nnodes=3, but resources.nodes is 1"),
    (["torchrun", "--nproc-per-node=2"], "names no training script"),
    (["torchrun", "--log-dir"], "option --log-dir has no value"),
])
def test_torchrun_options_that_disagree_with_the_spec_are_refused_naming_the_field(argv: list[str],
                                                                                 expected: str) -> None:
    with pytest.raises(TorchrunError, match=expected.replace("(", r"\(")):
        split_torchrun(argv, PY, nodes=1, per_node=2)


def test_the_spec_refuses_them_at_load_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="resources.tasks_per_node is 2"):
        _run(tmp_path, ["torchrun", "--nproc-per-node=8", "t.py"])
    assert not (tmp_path / "work").exists()


def test_starts_torchrun_recognises_the_launch_forms() -> None:
    assert starts_torchrun(["torchrun", "t.py"]) and starts_torchrun(["/x/bin/torchrun", "t.py"])
    assert starts_torchrun(["python3", "-m", TORCHRUN_MODULE, "t.py"])
    assert not starts_torchrun(["python", "t.py"]) and not starts_torchrun(["torchrunner", "t.py"])


def test_one_torchrun_per_node_is_launched_holding_a_cpu_per_rank(tmp_path: Path) -> None:
    run = _run(tmp_path, ["torchrun", "--nproc-per-node=2", "t.py"], nodes=2, per_node=2)
    assert run.torchrun and run.ranks == 4 and run.launch_tasks_per_node == 1
    text = render_slurm(run, 0, "d1").text
    assert "#SBATCH --ntasks-per-node=1\n" in text and "#SBATCH --cpus-per-task=2\n" in text
    assert "export SRUN_CPUS_PER_TASK=2\n" in text
    assert run.command is not None and run.command.torchrun_ranks == 4
    plain = _run(tmp_path, ["python", "t.py"], nodes=2, per_node=2)
    assert "--cpus-per-task" not in render_slurm(plain, 0, "d1").text and not plain.torchrun


def test_the_rank_side_places_its_node_and_names_the_attempt(tmp_path: Path) -> None:
    run = _run(tmp_path, ["torchrun", "--nproc-per-node=2", "--log-dir=l", "t.py"], nodes=2, per_node=2)
    assert run.command is not None
    env = DistEnv(rank=1, local_rank=0, world_size=2, node_rank=1, num_nodes=2, master_addr="n1", master_port=29400,
                  job_id="77", node="n2", scheduler="slurm")
    argv = torchrun_argv(run.command, env, "r0", 3, ["t.py", "--resume"])
    assert argv == [PY, "-m", TORCHRUN_MODULE, "--log-dir=l", "--nnodes=2", "--nproc-per-node=2", "--node-rank=1",
                    "--master-addr=n1", "--master-port=29400", "--rdzv-id=r0-a3", "--max-restarts=0", "t.py",
                    "--resume"]


def test_elastic_lets_torchrun_restart_through_a_c10d_rendezvous_whose_store_the_workers_do_not_share(
        tmp_path: Path) -> None:
    """torch 2.13: a restarted round's init_process_group hung 2 times in 4 with the static
    rendezvous and 3 in 3 with c10d's shared store; c10d unshared formed 5 of 5."""
    run = _run(tmp_path, ["torchrun", "--nproc-per-node=2", "t.py"], nodes=2, per_node=2, progress={"log": "^step (\\d+)"})
    assert run.command is not None
    env = DistEnv(rank=1, local_rank=0, world_size=2, node_rank=1, num_nodes=2, master_addr="n1", master_port=29400,
                  job_id="77", node="n2", scheduler="slurm")
    argv = torchrun_argv(run.command, env, "r0", 3, ["t.py"], restarts=2)
    assert argv == [PY, "-m", TORCHRUN_MODULE, "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=n1:29400", "--rdzv-id=r0-a3", "--max-restarts=2", "t.py"]
    assert ELASTIC_ENV == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@pytest.mark.parametrize(("workload", "named"), [
    ({"command": ["python", "t.py"], "progress": {"log": "^step (\\d+)"}}, "launched with torchrun"),
    ({"command": ["torchrun", "--nproc-per-node=2", "t.py"]}, "zero-code mode"),
    ({"command": ["torchrun", "--nproc-per-node=2", "t.py"], "progress": {"log": "^step (\\d+)"},
      "resume_args": ["--resume"]}, "workload.resume_args would never be added"),
    ({"framework": "torch"}, "launched with torchrun"),
])
def test_elastic_is_refused_for_what_torchrun_cannot_restart(tmp_path: Path, workload: dict, named: str) -> None:
    raw = {"name": "tr", "backend": "local", "workdir": str(tmp_path / "work"),
           "workload": {"framework": "torch", "steps": 50, **workload},
           "resources": {"nodes": 1, "tasks_per_node": 2}, "restart": {"strategy": "elastic"}}
    with pytest.raises(SpecError, match=named):
        parse_campaign(raw, base_dir=tmp_path)


def test_a_worker_takes_its_place_from_torchrun_not_from_its_nodes_task() -> None:
    worker = {"SLURM_PROCID": "1", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_NODEID": "1",
              "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "TORCHELASTIC_RUN_ID": "r0-a0",
              "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1", "MASTER_ADDR": "n1",
              "MASTER_PORT": "29400"}
    env = DistEnv.from_environ(worker, hostname="n2")
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.master_port) == (3, 4, 1, 1, 29400)
    assert env.job_id == "77"


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 30048)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 30049)  (SIGKILL)
=======================================================""".splitlines()


def test_torchruns_summary_names_the_first_failed_workers_end() -> None:
    """Not the peers torchrun ended itself (SIGTERM): the root cause."""
    assert root_cause_exit(SUMMARY) == -9
    assert root_cause_exit([line.replace("-9 (pid", "3 (pid") for line in SUMMARY]) == 3
    assert root_cause_exit(["Traceback", "ValueError: x"]) is None


@pytest.mark.parametrize(("argv", "name"), [
    (["accelerate", "launch", "--num_processes", "2", "t.py"], "accelerate launch"),
    (["deepspeed", "--num_gpus", "2", "t.py"], "deepspeed"),
    (["lightning", "run", "model", "t.py"], "lightning run"),
    (["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "t.py"], "torch.distributed.launch"),
    (["mpirun", "-np", "4", "python", "t.py"], "mpirun -np"),
    (["python", "t.py"], None), (["accelerate", "config"], None), (["torchrun", "t.py"], None),
])
def test_launchers_that_fork_their_own_workers_are_recognised(argv: list[str], name: str | None) -> None:
    from orchestrator.campaign.forking import forking_launcher
    found = forking_launcher(argv)
    assert (found.name if found else None) == name


def test_validate_says_what_a_drill_cannot_target_under_such_a_launcher(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up front: the rank is the launcher and all it starts; once per launcher, not per run."""
    from orchestrator.control.controller import plan_drill
    program = tmp_path / "bin" / "accelerate"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{program.parent}:/usr/bin:/bin")
    raw = {"name": "acc", "backend": "local", "workdir": str(tmp_path / "work"),
           "workload": {"command": ["accelerate", "launch", "t.py"], "framework": "torch", "steps": 10,
                        "progress": {"log": r"step (\d+)"}},
           "sweep": {"grid": {"workload.seed": [1, 2]}}}
    with caplog.at_level("WARNING"):
        plan_drill(parse_campaign(raw, base_dir=tmp_path))
    notes = [record.getMessage() for record in caplog.records if "forks its own workers" in record.getMessage()]
    assert len(notes) == 1 and "accelerate launch" in notes[0] and "workload.launcher: torchrun" in notes[0], notes


def test_interpreter_options_cannot_pass_through_torchrun() -> None:
    with pytest.raises(TorchrunError, match="the interpreter option -u cannot pass through torchrun"):
        split_torchrun(["python", "-u", "t.py"], PY, nodes=1, per_node=2)


def test_python_m_torch_distributed_run_uses_the_drills_interpreter_and_its_prefixes_are_options() -> None:
    split = split_torchrun(["python", "-m", TORCHRUN_MODULE, "--nproc=2", "--", "t.py", "--nproc=9"], PY, 1, 2)
    assert split.program == (PY, "-m", TORCHRUN_MODULE) and split.options == () and split.script == ("t.py", "--nproc=9")
    with pytest.raises(TorchrunError, match="--nproc-per-node=4"):
        split_torchrun(["torchrun", "--nproc=4", "t.py"], PY, 1, 2)


def test_torchrun_behind_a_wrapper_is_named_up_front() -> None:
    from orchestrator.campaign.forking import forking_launcher
    for argv in (["uv", "run", "torchrun", "t.py"], ["env", "X=1", "torchrun", "t.py"],
                 ["python", "-u", "-m", "torch.distributed.run", "t.py"]):
        found = forking_launcher(argv)
        assert found is not None and found.name.startswith("torchrun behind"), argv


def test_torchrun_ended_by_a_signal_it_handles_is_a_rank_ended_by_it() -> None:
    """SIGTERM (the scheduler's, or kill-rank process: launcher with SIGTERM): torchrun ends its
    workers and exits 1 without a summary."""
    tail = ["Traceback (most recent call last):",
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15"]
    assert root_cause_exit(tail) == -15


def test_a_launcher_fault_on_a_run_without_a_launcher_is_refused_at_load(tmp_path: Path) -> None:
    raw = {"name": "l", "backend": "local", "workdir": str(tmp_path / "work"),
           "workload": {"framework": "torch", "steps": 50},
           "faults": [{"kind": "kill-rank", "process": "launcher", "after": {"at_step": 10}}]}
    with pytest.raises(SpecError, match="process: launcher aims at the torchrun"):
        parse_campaign(raw, base_dir=tmp_path)


RECORDS_SIGNALS = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
for number in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(number, lambda n, f: out.write_text(out.read_text() + signal.Signals(n).name + " " if out.exists() else signal.Signals(n).name + " "))
out.with_suffix(".ready").write_text("")
while True:
    time.sleep(0.05)
"""


@pytest.mark.drill  # starts processes
def test_the_schedulers_warning_goes_to_the_workers_not_to_torchrun(tmp_path: Path) -> None:
    """torchrun does not handle SIGUSR2 (it would die of it) and each worker leads a session of its
    own: the supervisor passes the warning to the workers' groups; SIGTERM still goes to torchrun."""
    import signal
    import subprocess

    from experiments.runtime.command import Supervisor
    from rank_launch import wait_for

    def start(name: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([PY, "-c", RECORDS_SIGNALS, str(tmp_path / name)], process_group=0)
        wait_for(lambda: (tmp_path / name).with_suffix(".ready").exists(), 30, f"{name} to start")
        return proc

    agent, worker = start("agent.txt"), start("worker.txt")
    try:
        supervisor = object.__new__(Supervisor)
        supervisor.child = agent  # torchrun's stand-in
        supervisor.workers = type("Registry", (), {"worker_pids": lambda self: [worker.pid]})()  # type: ignore[assignment]  # the registry's one method used here
        supervisor._forward(signal.SIGUSR2, None)
        wait_for(lambda: (tmp_path / "worker.txt").exists(), 10, "the worker to get the warning")
        supervisor._forward(signal.SIGTERM, None)
        wait_for(lambda: (tmp_path / "agent.txt").exists(), 10, "torchrun to get SIGTERM")
        assert (tmp_path / "worker.txt").read_text().split() == ["SIGUSR2"]
        assert (tmp_path / "agent.txt").read_text().split() == ["SIGTERM"]
    finally:
        for proc in (agent, worker):
            proc.kill()
            proc.wait(timeout=10)


def test_a_node_is_placed_by_its_tasks_rank_not_by_node_variables_it_may_lack(tmp_path: Path) -> None:
    """Under PBS the second node's mpiexec task sees none of the job's node variables (its DistEnv
    says one node): its torchrun started all four workers alone and the first node's waited for ever."""
    run = _run(tmp_path, ["torchrun", "--nproc-per-node=2", "t.py"], nodes=2, per_node=2)
    assert run.command is not None
    second = DistEnv(rank=1, local_rank=0, world_size=2, node_rank=0, num_nodes=1, master_addr="n1",
                     master_port=29400, job_id="77", node="n2", scheduler="single")
    argv = torchrun_argv(run.command, second, "r0", 0, ["t.py"])
    assert "--nnodes=2" in argv and "--node-rank=1" in argv and "--nproc-per-node=2" in argv
