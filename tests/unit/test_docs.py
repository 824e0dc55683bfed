"""The README and docs/ stay true to the tree: the README opens with its two commands and stays
short, docs/architecture.md names every package and module and only paths that exist, relative
links resolve, and table rows stay readable. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"

README_MAX_LINES = 160
TABLE_ROW_MAX = 160
README_COMMANDS = ["scripts/faultdrill drill experiments/campaigns/quick.yaml", "scripts/test"]
PACKAGE_ROOTS = ("orchestrator", "experiments", "injectors")
# Modules that architecture.md must name one by one (experiments/examples/ is no package).
MODULE_ROOTS = ("orchestrator", "experiments/runtime", "experiments/warm")

# A path into the code as prose names it: `orchestrator/control/tracker.py`, `orchestrator/control/`.
PATH_TOKEN = re.compile(r"(?<![\w./-])((?:orchestrator|experiments|injectors|templates)(?:/[\w.-]+)*/?)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def named_paths(text: str) -> set[str]:
    """Every code path ``text`` names, as written (a trailing full stop of a sentence dropped)."""
    return {match.rstrip(".") if not match.endswith("/") else match for match in PATH_TOKEN.findall(text)}


def markdown_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def outside_code_blocks(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def packages() -> list[str]:
    """Every package directory under the package roots, as ``dir/``."""
    return sorted(f"{init.parent.relative_to(REPO).as_posix()}/"
                  for root in PACKAGE_ROOTS for init in (REPO / root).rglob("__init__.py"))


def modules() -> list[str]:
    """Every module architecture.md must name: *.py under MODULE_ROOTS but __init__.py, examples."""
    found = set()
    for root in MODULE_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            if path.name != "__init__.py" and not relative.startswith("experiments/examples/"):
                found.add(relative)
    return sorted(found)


def test_the_docs_pages_exist() -> None:
    expected = ["architecture", "benchmarks", "contributing", "faults", "local-cluster", "own-script", "pbs",
                "report", "safety", "sites", "spec", "strategies"]
    missing = [f"docs/{name}.md" for name in expected if not (DOCS / f"{name}.md").is_file()]
    assert not missing, f"docs pages missing: {missing}"


def test_every_code_path_architecture_names_exists() -> None:
    named = named_paths(ARCHITECTURE.read_text())
    missing = sorted(path for path in named
                     if (path.endswith((".py", ".j2")) or path.endswith("/")) and not (REPO / path).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_architecture_names_every_package_and_module() -> None:
    named = named_paths(ARCHITECTURE.read_text())
    unnamed_packages = [package for package in packages() if package not in named]
    unnamed_modules = [module for module in modules() if module not in named]
    assert not unnamed_packages and not unnamed_modules, (
        "docs/architecture.md does not name "
        f"these packages (as dir/): {unnamed_packages}; these modules (by path): {unnamed_modules}")


def test_the_readme_is_short() -> None:
    count = len(README.read_text().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines; at most {README_MAX_LINES}: move the rest to docs/"


def test_the_readme_opens_with_its_two_commands() -> None:
    lines = README.read_text().splitlines()
    fence = next((index for index, line in enumerate(lines) if line.strip().startswith("```")), None)
    assert fence is not None and lines[fence].strip() == "```bash", "README.md: its first code block must be ```bash"
    prose = [line for line in lines[:fence] if line.strip() and not line.startswith("# ")]
    assert len(prose) <= 1, f"README.md: at most one line between the title and the commands, found {prose}"
    block = []
    for line in lines[fence + 1:]:
        if line.strip().startswith("```"):
            break
        command = line.split("#", 1)[0].strip()
        if command:
            block.append(command)
    assert block == README_COMMANDS, f"README.md's first ```bash block holds {block}; expected exactly {README_COMMANDS}"


def test_relative_links_resolve() -> None:
    broken = []
    for page in markdown_pages():
        for line in outside_code_blocks(page.read_text()):
            for target in MARKDOWN_LINK.findall(line):
                if target.startswith(("http://", "https://", "#", "mailto:")):
                    continue
                path = target.split("#", 1)[0]
                if not (page.parent / path).is_file():
                    broken.append(f"{page.relative_to(REPO)}: ({target})")
    assert not broken, "relative links to files that do not exist:\n" + "\n".join(broken)


def test_table_rows_stay_short() -> None:
    long_rows = [f"{page.relative_to(REPO)}: {len(line)} characters: {line[:60]}..."
                 for page in markdown_pages() for line in outside_code_blocks(page.read_text())
                 if line.lstrip().startswith("|") and len(line) > TABLE_ROW_MAX]
    assert not long_rows, (f"table rows longer than {TABLE_ROW_MAX} characters (put the long text under the table):\n"
                           + "\n".join(long_rows))
