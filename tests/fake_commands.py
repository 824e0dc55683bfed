"""Scheduler commands that answer with recorded output: for unit tests of the argument lists a
backend builds and of how it reads what the scheduler prints (the real ones run in tests/cluster)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

FAKE = """#!/bin/bash
{marker}
name=$(basename "$0")
printf '%s\\n' "$name $*" >> "$FAKE_COMMANDS_DIR/calls"
[ -f "$FAKE_COMMANDS_DIR/$name.out" ] && cat "$FAKE_COMMANDS_DIR/$name.out"
[ -f "$FAKE_COMMANDS_DIR/$name.err" ] && cat "$FAKE_COMMANDS_DIR/$name.err" >&2
exit "$(cat "$FAKE_COMMANDS_DIR/$name.rc" 2>/dev/null || echo 0)"
"""


@dataclass
class FakeCommands:
    folder: Path

    def answer(self, command: str, stdout: str = "", rc: int = 0, stderr: str = "") -> None:
        (self.folder / f"{command}.out").write_text(stdout)
        (self.folder / f"{command}.err").write_text(stderr)
        (self.folder / f"{command}.rc").write_text(str(rc))

    @property
    def calls(self) -> list[str]:
        path = self.folder / "calls"
        return path.read_text().splitlines() if path.exists() else []


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> FakeCommands:
    """``names`` on PATH ahead of the real ones, each logging its call and printing its answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        (bin_dir / name).write_text(FAKE.format(marker=""))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_COMMANDS_DIR", str(tmp_path))
    return FakeCommands(tmp_path)
