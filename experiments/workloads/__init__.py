"""Built-in workloads, one module per framework, imported only when asked for.

Importing a framework costs seconds (torch ~1.6 s, tensorflow ~3.4 s), so the registry holds
import paths, not classes: asking for ``torch`` never imports tensorflow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiments.workloads.base import Workload

LAUNCHER_DIRECT = "direct"  # one process per rank, started by srun or submitit's local executor
LAUNCHER_MPI = "mpi"  # ranks must come from an MPI launcher (srun --mpi=pmix, mpiexec)
LAUNCHER_TORCHRUN = "torchrun"  # a command's ranks are the workers of one torchrun per node


@dataclass(frozen=True)
class WorkloadEntry:
    target: str  # "module:Class"
    launcher: str = LAUNCHER_DIRECT
    # Variables a rank process must be started with (too late to set once Python runs).
    environment: tuple[tuple[str, str], ...] = ()


# A new framework is one module and one line here.
REGISTRY: dict[str, WorkloadEntry] = {
    "torch": WorkloadEntry("experiments.workloads.torch_workload:TorchWorkload"),
    "tensorflow": WorkloadEntry("experiments.workloads.tf_workload:TensorFlowWorkload"),
    # Chainer imports numpy.distutils, which needs the standard library's distutils: the
    # setuptools that torch requires (>= 77) no longer ships the parts it uses.
    "chainer": WorkloadEntry("experiments.workloads.chainer_workload:ChainerWorkload", LAUNCHER_MPI,
                             (("SETUPTOOLS_USE_DISTUTILS", "stdlib"),)),
}


class UnknownFrameworkError(ValueError):
    pass


def entry(framework: str) -> WorkloadEntry:
    found = REGISTRY.get(framework)
    if found is None:
        valid = ", ".join(sorted(REGISTRY))
        raise UnknownFrameworkError(f"unknown framework {framework!r}; valid frameworks: {valid}")
    return found


def get_workload(framework: str) -> "Workload":
    """A fresh workload instance for ``framework``."""
    module_name, _, class_name = entry(framework).target.partition(":")
    workload_class = getattr(importlib.import_module(module_name), class_name)
    return workload_class()
