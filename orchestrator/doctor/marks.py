"""The doctor's files in the checkpoint directory: the login node leaves one while the test job
runs, each node looks for it and leaves one of its own, which the login node looks for. Named with
the doctor run's token, so that two doctors on one directory do not touch each other's files, nor
anyone else's."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from injectors.probe import login_mark, node_mark

LOOK_WITHIN_S = 5.0  # a node's file, written before its facts, given this long to be seen here


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
    seen: dict[str, bool] = field(default_factory=dict)  # each node's file, as seen here while the job ran
    ended_by_itself: bool = True  # the test job ran its last step (each node removing its own file)

    def unconfirmed(self) -> list[str]:
        """Nodes whose file may be left where only they see it: the job was ended before its last
        step, and the file was never seen here (to be removed from here)."""
        if self.ended_by_itself:
            return []
        return sorted(node for node in self._nodes if not self.seen.get(node, False))

    def look(self, nodes: Iterable[str], within_s: float = LOOK_WITHIN_S) -> None:
        """Whether each node's file is seen here, looked for while the job runs (its last step
        removes it): until all are, or ``within_s`` (a network filesystem's cache may show a new
        file a moment late)."""
        deadline = time.monotonic() + within_s
        waiting = set(nodes)
        while True:
            for node in sorted(waiting):
                self.seen[node] = self.node_file(node).is_file()
            waiting = {node for node in waiting if not self.seen[node]}
            if not waiting or time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def sees(self, node: str) -> bool:
        """The login node saw ``node``'s file (as it looked while the job ran, else now)."""
        return self.seen[node] if node in self.seen else self.node_file(node).is_file()

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
