"""The attempt's timeline (``events.jsonl``): one JSON object a line, ``event`` and ``time`` first.

Only rank 0 writes from Python (the batch script appends too), so the controller reads one file
per attempt; other ranks get a disabled log rather than ``if rank == 0`` at every call site.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from experiments.layout import append_json_line


class EventLog:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def emit(self, event: str, when: float | None = None, **fields: Any) -> None:
        if self.enabled:
            append_json_line(self.path, {"event": event, "time": time.time() if when is None else when, **fields})
