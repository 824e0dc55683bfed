"""Launchers a command may start that fork their own workers, besides torchrun (which Faultdrill
runs itself: orchestrator/campaign/torchrun.py). Under them the rank Faultdrill knows is the
launcher: its whole process group takes a fault's signal and is ended with it (the supervisor
adopts what it leaves behind, experiments/runtime/command.py), but a fault cannot pick one of its
workers, and the workers' own rendezvous is the launcher's. ``validate`` and ``drill`` say so up
front, naming what to use instead where there is something."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ForkingLauncher:
    name: str
    instead: str  # what the drill can do better with it, if anything


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """The program (its file name) and its arguments, past a Python interpreter's ``-m``."""
    name, rest = os.path.basename(argv[0]), argv[1:]
    if name.startswith("python") and len(rest) > 1 and rest[0] == "-m":
        return rest[1], rest[2:]
    return name, rest


def forking_launcher(argv: list[str]) -> ForkingLauncher | None:
    """The forking launcher ``argv`` starts (not torchrun), or None."""
    program, rest = _program(argv)
    if program in ("accelerate", "accelerate.commands.launch") and (program != "accelerate" or rest[:1] == ["launch"]):
        return ForkingLauncher("accelerate launch", "it runs torchrun: give the script to workload.launcher: torchrun")
    if program in ("deepspeed", "deepspeed.launcher.runner"):
        return ForkingLauncher("deepspeed", "with one node per task, workload.launcher: torchrun starts the same workers")
    if program == "lightning" and rest[:1] == ["run"]:
        return ForkingLauncher("lightning run", "Lightning's Trainer finds torchrun's workers: workload.launcher: torchrun")
    if program == "torch.distributed.launch":
        return ForkingLauncher("torch.distributed.launch", "its successor is torchrun: workload.launcher: torchrun")
    if any(os.path.basename(word) == "torchrun" or word == "torch.distributed.run" for word in argv[1:5]):
        return ForkingLauncher(f"torchrun behind {os.path.basename(argv[0])}",
                               "write the command as [torchrun, ...], with variables in workload.env, and the drill "
                               "places its workers as the ranks")
    if program in ("mpirun", "mpiexec") and any(word in ("-np", "-n", "--np") or word.startswith("-np=")
                                                  for word in rest):
        return ForkingLauncher(f"{program} -np", "workload.launcher: mpi starts the ranks through MPI itself")
    return None


def forking_note(run_id: str, launcher: ForkingLauncher) -> str:
    return (f"{run_id}: workload.command starts {launcher.name}, which forks its own workers: the drill's rank is "
            f"{launcher.name} and all it starts (one process group, ended with it); a rank fault reaches its "
            f"workers only through it, and they are not told apart ({launcher.instead})")
