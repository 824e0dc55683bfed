"""A `type: ignore` says what it silences and why, everywhere (mypy checks the packages, not the
tests, so its unused-ignore warning cannot keep the tests honest)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("orchestrator", "experiments", "injectors", "tests", "bench", "scripts")
WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[\w, -]+\]\s+#\s*\S")


def bare_ignores(source: str) -> list[int]:
    """Lines of ``source`` whose `type: ignore` comment names no error code or gives no reason."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and "type: ignore" in token.string and not WITH_REASON.search(token.string):
            found.append(token.start[0])
    return found


def test_a_bare_ignore_is_found_and_a_reasoned_one_is_not() -> None:
    assert bare_ignores("x = f()  # type: ignore\ny = g()  # type: ignore[arg-type]\n") == [1, 2]
    assert bare_ignores("x = f()  # type: ignore[arg-type]  # a stand-in\n") == []


def test_every_type_ignore_has_a_code_and_a_reason() -> None:
    bare = [f"{path.relative_to(REPO)}:{line}" for top in CHECKED for path in sorted((REPO / top).rglob("*.py"))
            for line in bare_ignores(path.read_text())]
    assert bare == [], "type: ignore without [code] and '# reason': " + ", ".join(bare)
