"""Incremental readers of the JSON-lines files ranks and batch scripts append to, each line read
back into its record type (experiments/layout.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

Record = TypeVar("Record")


class JsonlTail(Generic[Record]):
    """Reads only what was appended since the last call, each line through ``parse`` (a record's
    ``from_json``); a torn last line waits for its end, a line that is no record is skipped."""

    def __init__(self, path: Path, parse: Callable[[dict[str, Any]], Record]) -> None:
        self.path, self.parse = path, parse
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[Record]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        records = []
        for line in lines:
            try:
                records.append(self.parse(json.loads(line.decode("utf-8", errors="replace"))))
            except (ValueError, KeyError, TypeError, AttributeError):  # a torn line, NULs a node crash left
                continue
        return records
