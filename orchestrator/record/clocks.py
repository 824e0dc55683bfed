"""Compute nodes' clocks against the login node's (the controller's, the drill's reference clock).

A recovery's moments are stamped on several machines: the fault agent's node, the controller, the
batch host, rank 0's node. Each node's clock is read against the login node's by NTP's estimate
over a conversation with a process on the node (orchestrator.observe.node_clocks): the login
node's clock before it asks (t0) and after the answer (t1), the node's reading between them; the
offset is the reading minus the middle of [t0, t1], true within half that round trip. The quickest
exchange of several is taken (its bounds are the tightest).

An attempt's readings are kept in ``attempts/<n>/clocks.json`` (RunPaths.clocks_file), written by
the controller alone. A moment stamped on a node becomes ``time - offset`` on the login clock, with
the reading's uncertainty (grown by the drift allowed since it was taken). A moment on a node with
no reading keeps its time, and its uncertainty is unknown (None): the report says "not measured".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.layout import write_json_atomic

LOGIN = "login"  # the controller's clock: the reference, offset 0 by definition
SCHEDULER = "scheduler"  # the scheduler's own stamps (sacct's End): a clock nobody measured
UNKNOWN_NODE = "an unknown node"  # a node stamp whose node is not known: no reading applies, none is one clock
# A reading's bounds widen as it ages: clocks that NTP disciplines drift well under this (100 ppm).
DRIFT_PER_S = 1e-4


@dataclass(frozen=True)
class ClockReading:
    offset_s: float  # the node's clock minus the login node's
    uncertainty_s: float  # the true offset lies within offset_s +- this
    exchanges: int
    measured_at: float = 0.0  # the login node's clock when it was read

    def uncertainty_at(self, moment: float) -> float:
        """The bounds at ``moment``: the reading's, widened by the drift allowed since (or before) it."""
        return self.uncertainty_s + abs(moment - self.measured_at) * DRIFT_PER_S

    def to_json(self) -> dict[str, float]:
        return {"offset_s": self.offset_s, "uncertainty_s": self.uncertainty_s, "exchanges": self.exchanges,
                "measured_at": self.measured_at}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "ClockReading":
        return cls(float(record["offset_s"]), float(record["uncertainty_s"]), int(record["exchanges"]),
                   float(record.get("measured_at", 0.0)))


@dataclass(frozen=True)
class Exchange:
    asked_at: float  # the login node's clock
    node_time: float
    answered_at: float  # the login node's clock

    @property
    def round_trip_s(self) -> float:
        return self.answered_at - self.asked_at


def offset_of(exchanges: list[Exchange]) -> ClockReading:
    """The offset from the quickest exchange, with half its round trip as the uncertainty."""
    if not exchanges:
        raise ValueError("no exchange to read an offset from")
    best = min(exchanges, key=lambda exchange: exchange.round_trip_s)
    middle = (best.asked_at + best.answered_at) / 2
    return ClockReading(best.node_time - middle, best.round_trip_s / 2, len(exchanges), middle)


@dataclass(frozen=True)
class Stamp:
    """A moment as the clock that took it reads it: ``clock`` is a node's name, LOGIN or SCHEDULER."""

    time: float
    clock: str


@dataclass(frozen=True)
class OnLogin:
    """A stamp moved onto the login clock: ``uncertainty_s`` None where its clock was not read;
    ``offset_s`` the offset it was moved by (0 on the login clock, None unread)."""

    time: float
    uncertainty_s: float | None
    clock: str
    offset_s: float | None = 0.0


@dataclass
class AttemptClocks:
    """The clocks an attempt's moments were stamped on. ``one_clock``: every stamp is this host's
    (the local backend), exact as it is."""

    one_clock: bool = False
    readings: dict[str, ClockReading] = field(default_factory=dict)
    unmeasured: dict[str, str] = field(default_factory=dict)  # node -> why its clock was not read

    def on_login(self, stamp: Stamp) -> OnLogin:
        if self.one_clock or stamp.clock == LOGIN:
            return OnLogin(stamp.time, 0.0, stamp.clock)
        reading = self.readings.get(stamp.clock)
        if reading is None:
            return OnLogin(stamp.time, None, stamp.clock, None)
        return OnLogin(stamp.time - reading.offset_s, reading.uncertainty_at(stamp.time), stamp.clock, reading.offset_s)

    def merged_with(self, other: "AttemptClocks") -> "AttemptClocks":
        """These readings, and ``other``'s of the nodes not read here (an attempt that ended before
        its node's clock was read: the same node's reading of the attempt beside it)."""
        readings = {**other.readings, **self.readings}
        return AttemptClocks(self.one_clock or other.one_clock, readings,
                             {node: why for node, why in self.unmeasured.items() if node not in readings})

    def to_json(self) -> dict[str, Any]:
        return {"one_clock": self.one_clock, "readings": {node: r.to_json() for node, r in self.readings.items()},
                "unmeasured": dict(self.unmeasured)}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "AttemptClocks":
        return cls(bool(record.get("one_clock")),
                   {node: ClockReading.from_json(r) for node, r in (record.get("readings") or {}).items()},
                   {str(node): str(why) for node, why in (record.get("unmeasured") or {}).items()})

    def offsets_json(self) -> dict[str, list[float]]:
        """node -> [offset, uncertainty]: what the report shows."""
        return {node: [round(r.offset_s, 6), round(r.uncertainty_s, 6)] for node, r in sorted(self.readings.items())}


def load_clocks(path: Path) -> AttemptClocks:
    """An attempt's clocks file; none (not measured: the job ended first, an older drill) reads as
    no reading at all."""
    try:
        record = json.loads(path.read_text())
        return AttemptClocks.from_json(record) if isinstance(record, dict) else AttemptClocks()
    except (OSError, ValueError, KeyError, TypeError):
        return AttemptClocks()


def save_clocks(path: Path, clocks: AttemptClocks) -> None:
    write_json_atomic(path, clocks.to_json())


def between(earlier: OnLogin, later: OnLogin) -> float | None:
    """The uncertainty of ``later - earlier``: none on one clock moved by one offset (it cancels),
    the sum of both bounds otherwise, unknown where either clock was not read (or its node is not
    known)."""
    if earlier.clock == later.clock != UNKNOWN_NODE and earlier.offset_s == later.offset_s:
        return 0.0
    if earlier.uncertainty_s is None or later.uncertainty_s is None:
        return None
    return earlier.uncertainty_s + later.uncertainty_s
