"""When faults fire: delays drawn from a seeded distribution, so a drill is reproducible."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixedDelay(_Strict):
    fixed: float = Field(ge=0)


class ExponentialDelay(_Strict):
    exponential: float = Field(gt=0, description="mean delay in seconds")
    min: float = Field(0.0, ge=0)
    max: float | None = Field(None, gt=0)


Delay = FixedDelay | ExponentialDelay


@dataclass(frozen=True)
class DelayDistribution:
    """``fixed`` seconds, or an exponential with mean ``mean_s`` clipped to [min_s, max_s]."""

    fixed_s: float | None = None
    mean_s: float | None = None
    min_s: float = 0.0
    max_s: float | None = None

    @classmethod
    def of(cls, delay: Delay) -> "DelayDistribution":
        if isinstance(delay, FixedDelay):
            return cls(fixed_s=delay.fixed)
        return cls(mean_s=delay.exponential, min_s=delay.min, max_s=delay.max)

    def draw(self, rng: random.Random) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        if self.mean_s is None:
            raise ValueError("a delay is either fixed or exponential with a mean")
        delay = self.min_s + rng.expovariate(1.0 / self.mean_s)
        return min(delay, self.max_s) if self.max_s is not None else delay


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a run: what to do, to whom, how long after its anchor."""

    index: int
    kind: str
    delay_s: float
    anchor: str  # "training_start" | "first_checkpoint" of the attempt it fires in
    ranks: tuple[int, ...] = ()  # rank kinds: the ranks it hits, drawn when the drill is planned
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own options (signal, duration_s, ...)
    target: str = ""  # the planned target in words

    @property
    def signal(self) -> str:
        return str(self.options.get("signal", ""))


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded from stable text (not Python's salted hash), so plans repeat across runs."""
    digest = hashlib.sha256("/".join(str(part) for part in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


