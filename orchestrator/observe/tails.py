"""Incremental readers of the JSON-lines files ranks and batch scripts append to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonlTail:
    """Reads only what was appended since the last call; a torn last line waits for its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
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
                records.append(json.loads(line.decode("utf-8", errors="replace")))
            except ValueError:  # a torn line, a run of NULs a node crash left
                continue
        return records
