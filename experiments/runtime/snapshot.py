"""A checkpoint taken in two parts, so that training waits only for the first.

``Snapshot``: called on the training thread with the sink of this rank's share, it captures the
state (a copy in memory: the model may change as soon as it returns) and returns a ``ShareWriter``,
which writes that copy into the sink and may run on another thread. A synchronous save is both
parts in a row.
"""

from __future__ import annotations

from typing import Callable

from experiments.runtime.sink import FileSink

ShareWriter = Callable[[], None]
Snapshot = Callable[[FileSink], ShareWriter]
