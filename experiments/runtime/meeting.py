"""Collectives through files in the attempt's directory, for ranks that share no process group
with Faultdrill (a user's script brings its own, or none yet when it asks where to resume).

Every rank calls the collectives in the same order; call N meets in ``attempts/<a>/meet/N-*``.
The files are coordination, not data: written by rename (a reader never sees half of one), not
fsynced. A peer that does not arrive within the timeout is named in the error.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class MeetingTimeout(TimeoutError):
    """A rank did not arrive at a meeting in time."""


class FileCollectives:
    POLL_MIN_S = 0.002
    POLL_MAX_S = 0.05

    def __init__(self, directory: Path, rank: int, world_size: int, timeout_s: float = 300.0) -> None:
        self.directory, self.rank, self.world_size, self.timeout_s = directory, rank, world_size, timeout_s
        self.calls = 0

    def barrier(self, timeout_s: float | None = None) -> None:
        call = self._next()
        self._publish(f"{call}-arrived-{self.rank}", "")
        names = [f"{call}-arrived-{rank}" for rank in range(self.world_size)]
        self._wait(names, timeout_s, f"barrier {call}")
        if self.rank == 0:
            self._forget_before(call)

    def _forget_before(self, call: int) -> None:
        """Every rank reached this barrier, so every earlier meeting is over: its files go (a long
        run meets every few steps; the directory holds one checkpoint interval's worth)."""
        for path in self.directory.iterdir():
            number = path.name.lstrip(".").split("-", 1)[0]
            if number.isdigit() and int(number) < call:
                path.unlink(missing_ok=True)

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        call = self._next()
        name = f"{call}-value"
        if self.rank == 0:
            self._publish(name, json.dumps(int(value)))
            return int(value)
        self._wait([name], timeout_s, f"broadcast {call} from rank 0")
        return int(json.loads((self.directory / name).read_text()))

    def _next(self) -> int:
        self.calls += 1
        return self.calls

    def _publish(self, name: str, text: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, self.directory / name)

    def _wait(self, names: list[str], timeout_s: float | None, what: str) -> None:
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        pause = self.POLL_MIN_S
        while missing := [name for name in names if not (self.directory / name).exists()]:
            if time.monotonic() > deadline:
                raise MeetingTimeout(f"rank {self.rank}: {what}: {', '.join(missing)} not there after {limit:g} s "
                                     f"(in {self.directory}): a peer is gone or stuck")
            time.sleep(pause)
            pause = min(pause * 2, self.POLL_MAX_S)
