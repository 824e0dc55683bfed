"""The house's layers (docs/architecture.md): every import, at module level or inside a
function, points down or sideways within its layer; the compute side and the fault kinds never
import the login side; backends know no fault kind."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Top to bottom. A package may import its own layer's packages and every layer below it.
ORCHESTRATOR_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"cli"}),
    frozenset({"control"}),
    frozenset({"report", "strategies", "doctor", "project"}),
    frozenset({"faults"}),
    frozenset({"observe"}),
    frozenset({"backends"}),
    frozenset({"render", "record"}),
    frozenset({"campaign"}),
    frozenset({"commands", "states", "at_once"}),
)


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, wherever the import statement stands."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def layer_of(module: str) -> int:
    """The layer index of an ``orchestrator.*`` module (its first name below ``orchestrator``)."""
    name = module.split(".")[1]
    for index, layer in enumerate(ORCHESTRATOR_LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"{module}: package {name!r} is in no layer of ORCHESTRATOR_LAYERS")


def python_files(top: str) -> list[Path]:
    return sorted((REPO / top).rglob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def test_every_orchestrator_package_has_a_layer() -> None:
    packages = {path.relative_to(REPO / "orchestrator").parts[0].removesuffix(".py")
                for path in python_files("orchestrator") if path.name != "__init__.py" or path.parent != REPO / "orchestrator"}
    named = set().union(*ORCHESTRATOR_LAYERS)
    assert packages == named, f"in the tree, not in a layer: {packages - named}; in a layer, not in the tree: {named - packages}"


def test_orchestrator_imports_point_down() -> None:
    upward = []
    for path in python_files("orchestrator"):
        if path.parent == REPO / "orchestrator" and path.name == "__init__.py":
            continue
        here = layer_of(module_name(path))
        for target in imported_modules(path):
            if target.startswith("orchestrator.") and layer_of(target) < here:
                upward.append(f"{module_name(path)} imports {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_compute_side_and_the_fault_kinds_never_import_the_login_side() -> None:
    crossing = [f"{module_name(path)} imports {target}"
                for top in ("experiments", "injectors") for path in python_files(top)
                for target in imported_modules(path) if target.split(".")[0] == "orchestrator"]
    assert not crossing, "\n".join(crossing)


def test_backends_know_no_fault_kind() -> None:
    knowing = [f"{module_name(path)} imports {target}"
               for path in python_files("orchestrator/backends")
               for target in imported_modules(path) if target.startswith("injectors.kinds")]
    assert not knowing, "\n".join(knowing)
