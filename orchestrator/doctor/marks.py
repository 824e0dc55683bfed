"""The doctor's files in the checkpoint directory: the login node leaves one while the test job
runs, each node looks for it and leaves one of its own, which the login node looks for. Named with
the doctor run's token, so that two doctors on one directory do not touch each other's files, nor
anyone else's."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from injectors.probe import login_mark, node_mark


@dataclass
class CheckpointMarks:
    """The login node's file in the checkpoint directory while the test job runs (each node looks
    for it, and leaves one of its own), named with this doctor run's token: another doctor's files,
    a stranger's included, are never touched. After: this run's files removed, the login node's and
    each expected node's, by name. A file it cannot write or remove is a problem, said with why."""

    directory: Path
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    problems: list[str] = field(default_factory=list)  # what kept its file from being written
    left_behind: list[str] = field(default_factory=list)  # what it could not remove, and why
    _nodes: set[str] = field(default_factory=set)

    @property
    def login_file(self) -> Path:
        return self.directory / login_mark(self.token)

    def node_file(self, node: str) -> Path:
        return self.directory / node_mark(self.token, node)

    def expect(self, nodes: Iterable[str]) -> None:
        """Nodes that may have left a file here (removed on exit)."""
        self._nodes.update(nodes)

    def __enter__(self) -> CheckpointMarks:
        try:
            self.login_file.write_text("the doctor's test job looks for this file")
        except OSError as error:
            self.problems.append(f"the login node cannot write its file there ({error.strerror})")
        return self

    def __exit__(self, *_: object) -> None:
        for path in [self.login_file, *(self.node_file(node) for node in sorted(self._nodes))]:
            try:
                path.unlink(missing_ok=True)
            except OSError as error:
                self.left_behind.append(f"{path.name} ({error.strerror})")
