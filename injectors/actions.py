"""Records of the scheduler actions that fault kinds ask for and backends carry out.

They live apart from the kinds so that a backend can answer a kind's request without knowing any
fault kind (docs/architecture.md: backends know no fault kind).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WalltimeSet:
    """What moving a running job's walltime did: in words, and within how long the end is due."""

    said: str
    ends_within_s: float
