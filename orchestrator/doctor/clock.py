"""A node's clock against the login node's: NTP's estimate over a conversation with the node's
probe (``injectors.probe echo``). Each exchange: the login node's clock before it asks (t0) and
after the answer (t1), the node's reading between them; the offset is the reading minus the
middle of [t0, t1], true within half the round trip. The quickest exchange of several is taken
(its bounds are the tightest)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from injectors.probe import ECHO_READY
from orchestrator.commands import Conversation

PINGS = 16
ANSWER_TIMEOUT_S = 30.0  # the first answer waits for the step to start on the node
STRAY_LINES = 50  # lines a site's Python may print before the probe's own


@dataclass(frozen=True)
class ClockReading:
    offset_s: float  # the node's clock minus the login node's
    uncertainty_s: float  # the true offset lies within offset_s +- this
    exchanges: int


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
    return ClockReading(best.node_time - middle, best.round_trip_s / 2, len(exchanges))


def read_offset(probe: Conversation, pings: int = PINGS) -> ClockReading:
    """Talk to a started ``injectors.probe echo``: its ready line (what a site prints before it is
    skipped), then ``pings`` exchanges."""
    for _ in range(STRAY_LINES):
        if probe.read_line(ANSWER_TIMEOUT_S) == ECHO_READY:
            break
    else:
        raise probe.failed(f"no {ECHO_READY!r} line among its first {STRAY_LINES}")
    exchanges = []
    for _ in range(pings):
        asked_at = time.time()
        probe.say("t")
        answer = probe.read_line(ANSWER_TIMEOUT_S)
        try:
            node_time = float(answer)
        except ValueError:
            raise probe.failed(f"answered {answer[:80]!r}, not its clock") from None
        exchanges.append(Exchange(asked_at, node_time, time.time()))
    return offset_of(exchanges)
