"""What a drill on a few nodes cannot measure about a job at scale: named values, each with its
default and where it comes from, printed with every projection (orchestrator/project/projection.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Assumptions:
    """What a drill on a few nodes cannot measure: each value is printed with every projection."""

    queue_wait_s: float = 600.0
    startup_per_doubling_s: float = 2.0
    repair_h: float = 24.0

    SOURCES = {
        "queue_wait_s": "assumed: a new job's wait for its nodes at scale, in place of the drill's own queue (a "
                        "site's own: sacct Start - Submit, or qstat's qtime to stime, of its large jobs; requeue adds "
                        "it to the scheduler's hold it measured; --queue-wait-s)",
        "startup_per_doubling_s": "assumed: the start-up's growth (rendezvous, collectives' set-up) per doubling "
                                  "of the drill's GPUs (--startup-per-doubling-s)",
        "repair_h": "assumed: a dead node's time out of the pool before it is a spare again (--repair-h)",
    }

    def listed(self) -> list[dict[str, Any]]:
        return [{"name": name, "value": value, "source": self.SOURCES[name]} for name, value in asdict(self).items()]
