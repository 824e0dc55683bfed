"""The contract between the login side and the compute side is one module, experiments/layout.py
(docs/architecture.md): every FAULTDRILL_* variable name and every event name lives there and
nowhere else in the code, and no module imports itself back through others at run time."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "experiments" / "layout.py"
TOPS = ("orchestrator", "experiments", "injectors")


def code_files() -> list[Path]:
    return sorted(path for top in TOPS for path in (REPO / top).rglob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"


def literal_event_names(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Event names written as literals: ``{"event": "name", ...}`` and ``record["event"] == "name"``."""
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and key.value == "event" and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)):
                    found.append((node, value.value))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript):
            key = node.left.slice
            if isinstance(key, ast.Constant) and key.value == "event":
                found.extend((node, c.value) for c in node.comparators
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return found


def test_every_faultdrill_variable_name_is_spelled_in_the_contract_only() -> None:
    elsewhere = [f"{where(path, node)} {node.value}" for path in code_files() if path != CONTRACT
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and node.value.startswith("FAULTDRILL_")]
    assert not elsewhere, "FAULTDRILL_* names outside experiments/layout.py:\n" + "\n".join(elsewhere)


def test_event_records_name_their_event_by_the_contracts_constants() -> None:
    elsewhere = [f"{where(path, node)} {name!r}" for path in code_files() if path != CONTRACT
                 for node, name in literal_event_names(ast.parse(path.read_text()))]
    assert not elsewhere, "event names written as literals (use layout.EVENT_*):\n" + "\n".join(elsewhere)


def test_the_contract_check_finds_a_literal_event_and_variable() -> None:
    planted = ast.parse('write({"event": "job_start"})\nif e["event"] == "completed": pass\nx = "FAULTDRILL_X"')
    assert sorted(name for _, name in literal_event_names(planted)) == ["completed", "job_start"]


def runtime_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it runs (imports under ``if TYPE_CHECKING:`` excluded)."""
    tree = ast.parse(path.read_text())
    type_only = {id(inner) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                 for inner in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in code_files()}
    return {name: {target for target in runtime_imports(path) if target in modules and target != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back_at_run_time() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    """pytest imports test modules by basename (rootdir-relative, no packages): two tiers' files of
    one name stop the collection of the second ("import file mismatch": seen in CI)."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_the_batch_templates_take_the_contracts_names_from_it() -> None:
    """The templates write variables and events too: by the names render gives them (``contract``)."""
    import re

    spelled = [f"{path.relative_to(REPO)}:{number} {line.strip()}"
               for path in sorted((REPO / "templates").glob("*.j2"))
               for number, line in enumerate(path.read_text().splitlines(), start=1)
               if "FAULTDRILL_" in line or re.search(r'"event": "[a-z_]+"', line)]
    assert not spelled, "contract names spelled in a template (use {{ contract.env/event }}):\n" + "\n".join(spelled)


def contract_file_names() -> dict[str, str]:
    """The contract's file and step names (``*_NAME`` constants of experiments/layout.py): value -> constant."""
    tree = ast.parse(CONTRACT.read_text())
    return {node.value.value: target.id for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name) and target.id.endswith("_NAME")
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def spelled_file_names(path: Path, names: dict[str, str]) -> list[str]:
    """Where ``path`` (code or a template) writes one of ``names`` itself instead of taking the constant."""
    text = path.read_text()
    if path.suffix == ".py":
        return [f"{where(path, node)} {node.value!r} ({names[node.value]})" for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]
    return [f"{path.relative_to(REPO)}:{number} {value!r} ({constant})"
            for number, line in enumerate(text.splitlines(), start=1)
            for value, constant in names.items() if value in line]


def test_the_contracts_file_names_are_spelled_in_it_only() -> None:
    names = contract_file_names()
    assert {"events.jsonl", "relaunch-exclude", "faultdrill-ranks", "manifest.json"} <= set(names)
    files = [path for path in code_files() if path != CONTRACT] + sorted((REPO / "templates").glob("*.j2"))
    spelled = [found for path in files for found in spelled_file_names(path, names)]
    assert not spelled, "contract file names spelled outside experiments/layout.py:\n" + "\n".join(spelled)
