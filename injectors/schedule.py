"""When faults fire: delays drawn from a seeded distribution, so a drill is reproducible."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixedDelay(_Strict):
    """``{fixed: 3.0}``: this many seconds after the anchor."""

    fixed: float = Field(ge=0)

    def draw(self, rng: random.Random, ranks: int = 1, nodes: int = 1) -> float:
        return self.fixed


class _FailureRate(_Strict):
    """A delay drawn from a failure model: its parameters are per job, or per rank or per node, so
    that a larger job fails sooner (the time to the first of N independent failures); clipped to
    [min, max] after the anchor."""

    per: Literal["job", "rank", "node"] = "job"
    min: float = Field(0.0, ge=0)
    max: float | None = Field(None, gt=0)

    def units(self, ranks: int, nodes: int) -> int:
        return {"job": 1, "rank": ranks, "node": nodes}[self.per]

    def clip(self, delay: float) -> float:
        delay = self.min + delay
        return min(delay, self.max) if self.max is not None else delay


class ExponentialDelay(_FailureRate):
    """``{exponential: MTBF}``: exponential with that mean (seconds); N units fail N times as often."""

    exponential: float = Field(gt=0, description="mean time between failures, seconds")

    def draw(self, rng: random.Random, ranks: int = 1, nodes: int = 1) -> float:
        return self.clip(rng.expovariate(self.units(ranks, nodes) / self.exponential))

    def mean(self, ranks: int = 1, nodes: int = 1) -> float:
        return self.exponential / self.units(ranks, nodes)


class WeibullDelay(_FailureRate):
    """``{weibull: scale, shape: k}``: Weibull with that scale (seconds) and shape (k < 1: infant
    mortality, k > 1: wear-out). The first of N units: scale x N^(-1/k), the same shape."""

    weibull: float = Field(gt=0, description="scale, seconds")
    shape: float = Field(1.0, gt=0)

    def draw(self, rng: random.Random, ranks: int = 1, nodes: int = 1) -> float:
        return self.clip(rng.weibullvariate(self.scale(ranks, nodes), self.shape))

    def scale(self, ranks: int = 1, nodes: int = 1) -> float:
        return self.weibull * self.units(ranks, nodes) ** (-1.0 / self.shape)


class AtStep(_Strict):
    """``{at_step: 120}``: when the attempt's training reaches this step (not a time)."""

    at_step: int = Field(ge=1)

    def draw(self, rng: random.Random, ranks: int = 1, nodes: int = 1) -> float:
        return 0.0


Delay = FixedDelay | ExponentialDelay | WeibullDelay | AtStep


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a run: what to do, to whom, how long after its anchor."""

    index: int
    kind: str
    delay_s: float
    anchor: str  # "training_start" | "first_checkpoint" | "ranks_started" of the attempt it fires in
    at_step: int | None = None  # instead of a delay: when the attempt reaches this step
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


