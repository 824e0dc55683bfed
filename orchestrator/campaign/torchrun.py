"""A command run under torchrun (``workload.launcher: torchrun``, or a command that starts with
``torchrun`` / ``python -m torch.distributed.run``): Faultdrill starts one torchrun per node and
the ranks are torchrun's workers.

The user's command is split here, at load, into the torchrun program with the options Faultdrill
leaves to the user (``--log-dir``, ``--monitor-interval``, ...) and the training script with its
arguments. The options that place the workers are Faultdrill's, written by the rank side when the
node's place is known (experiments/runtime/torchrun.py): the node count and this node's rank, the
workers per node (``resources.tasks_per_node``), the rendezvous, ``--max-restarts 0`` (Faultdrill's
restart strategy recovers). A user's value for one of them that disagrees with the spec is refused,
naming the field to set instead; one that agrees is dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TORCHRUN_MODULE = "torch.distributed.run"
TORCHRUN_PROGRAMS = ("torchrun",)
# torchrun's options that take no value; every other option takes one (``--opt value`` or ``--opt=value``).
FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                   "--virtual-local-rank", "--virtual_local_rank"})
# Faultdrill's own (the placement of the workers); the value of one that must agree with the spec.
NODES, PER_NODE = "nnodes", "nproc-per-node"
OWNED = frozenset({NODES, PER_NODE, "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                   "standalone", "master-addr", "master-port", "max-restarts", "local-addr"})
SCRIPT_FLAGS = frozenset({"-m", "--module", "--no-python", "--no_python"})  # they say what the script is
PYTHON_NAMES = ("python", "python3")  # a command's argv[0] run with workload.python (the drill's by default)


class TorchrunError(ValueError):
    """The command's torchrun options cannot run as the spec says."""


@dataclass(frozen=True)
class TorchrunCommand:
    program: tuple[str, ...]  # torchrun, or <python> -m torch.distributed.run
    options: tuple[str, ...]  # the user's options Faultdrill leaves as they are
    script: tuple[str, ...]  # what torchrun runs on every worker: [-m | --no-python] script args...


def starts_torchrun(argv: list[str]) -> bool:
    """The command is a torchrun launch (its first word, or ``<python> -m torch.distributed.run``)."""
    if os.path.basename(argv[0]) in TORCHRUN_PROGRAMS:
        return True
    return len(argv) > 2 and argv[1] == "-m" and argv[2] == TORCHRUN_MODULE and "python" in os.path.basename(argv[0])


def split_torchrun(argv: list[str], python: str, nodes: int, per_node: int) -> TorchrunCommand:
    """``argv`` (placeholders filled) as torchrun's program, kept options and script. A command that
    does not start torchrun is the script: ``[python, train.py, ...]`` and ``[train.py, ...]`` run
    with ``python``; any other program with ``--no-python``."""
    if not starts_torchrun(argv):
        return TorchrunCommand((python, "-m", TORCHRUN_MODULE), (), _script_of(argv, python))
    skip = 1 if os.path.basename(argv[0]) in TORCHRUN_PROGRAMS else 3
    options, rest = _options(argv[skip:])
    if not rest:
        raise TorchrunError(f"workload.command: {' '.join(argv)!r} names no training script after torchrun's options")
    kept = _kept(options, {NODES: str(nodes), PER_NODE: str(per_node)})
    script_flags = [word for word in kept if word in SCRIPT_FLAGS]
    kept = [word for word in kept if word not in SCRIPT_FLAGS]
    # A bare "torchrun" (or "python -m torch.distributed.run") is the drill's interpreter's
    # (workload.python): the same program, found whether or not the virtual environment's bin is on
    # the ranks' PATH. A path to either stays as written.
    bare = argv[0] in TORCHRUN_PROGRAMS or argv[0] in PYTHON_NAMES
    program = (python, "-m", TORCHRUN_MODULE) if bare else tuple(argv[:skip])
    return TorchrunCommand(program, tuple(kept), tuple(script_flags + rest))


def _script_of(argv: list[str], python: str) -> tuple[str, ...]:
    if argv[0] == python or os.path.basename(argv[0]).startswith("python"):
        words = argv[1:]
        if not words:
            raise TorchrunError("workload.command: a Python interpreter with no script to run under torchrun")
        if words[0].startswith("-") and words[0] != "-m":
            raise TorchrunError(f"workload.command: the interpreter option {words[0]} cannot pass through torchrun, "
                                "which starts the workers' Python itself; drop it (PYTHONUNBUFFERED=1 is set) or give "
                                "its PYTHON* variable in workload.env")
        return tuple(words)
    if argv[0].endswith(".py"):
        return tuple(argv)
    return ("--no-python", *argv)


def _options(words: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """torchrun's options (name, value or None for a flag) up to the script, and the script's words."""
    options: list[tuple[str, str | None]] = []
    index = 0
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        if word == "--":  # the end of torchrun's options: the script follows
            return options, words[index + 1:]
        name, equals, value = word.partition("=")
        if equals:
            options.append((name, value))
        elif word in FLAGS:
            options.append((word, None))
        elif index + 1 < len(words):
            options.append((word, words[index + 1]))
            index += 1
        else:
            raise TorchrunError(f"workload.command: torchrun's option {word} has no value")
        index += 1
    return options, words[index:]


def _kept(options: list[tuple[str, str | None]], spec: dict[str, str]) -> list[str]:
    kept: list[str] = []
    for name, value in options:
        canonical = _unabbreviated(name.lstrip("-").replace("_", "-"))
        if canonical in spec and value is not None and value != spec[canonical]:
            field = "resources.nodes" if canonical == NODES else "resources.tasks_per_node"
            raise TorchrunError(f"workload.command: torchrun --{canonical}={value}, but {field} is {spec[canonical]}: "
                                f"set {field} (Faultdrill starts one torchrun per node, and its workers are the ranks)")
        if canonical in OWNED:
            continue  # Faultdrill's: written by the rank side for the node it runs on
        kept += [name] if value is None else [f"{name}={value}"]
    return kept


def _unabbreviated(name: str) -> str:
    """torchrun's parser takes an unambiguous prefix of an option (``--nproc`` for
    ``--nproc-per-node``): the option it stands for, if it is one of Faultdrill's."""
    if name in OWNED:
        return name
    longer = [owned for owned in OWNED if owned.startswith(name)]
    return longer[0] if len(longer) == 1 else name
