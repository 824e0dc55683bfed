"""Built-in workloads, one module per framework, imported only when asked for.

Importing a framework costs seconds (torch ~1.6 s, tensorflow ~3.4 s), so the registry holds
import paths, not classes: asking for ``torch`` never imports tensorflow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiments.workloads.base import Workload

# framework -> "module:class"; a new framework is one module and one line here.
REGISTRY: dict[str, str] = {
    "torch": "experiments.workloads.torch_mlp:TorchMLP",
}


class UnknownFrameworkError(ValueError):
    pass


def get_workload(framework: str) -> "Workload":
    """A fresh workload instance for ``framework``."""
    target = REGISTRY.get(framework)
    if target is None:
        valid = ", ".join(sorted(REGISTRY))
        raise UnknownFrameworkError(f"unknown framework {framework!r}; valid frameworks: {valid}")
    module_name, _, class_name = target.partition(":")
    workload_class = getattr(importlib.import_module(module_name), class_name)
    return workload_class()
