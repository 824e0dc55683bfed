"""When faults fire: delays drawn from a seeded distribution, so a drill is reproducible."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class DelayDistribution:
    """``fixed`` seconds, or an exponential with mean ``mean_s`` clipped to [min_s, max_s]."""

    fixed_s: float | None = None
    mean_s: float | None = None
    min_s: float = 0.0
    max_s: float | None = None

    def draw(self, rng: random.Random) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        if self.mean_s is None:
            raise ValueError("a delay is either fixed or exponential with a mean")
        delay = self.min_s + rng.expovariate(1.0 / self.mean_s)
        return min(delay, self.max_s) if self.max_s is not None else delay


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a run: what to do, to which rank, how long after its anchor."""

    index: int
    kind: str
    rank: int
    signal: str
    delay_s: float
    anchor: str  # "training_start" | "first_checkpoint" of the attempt it fires in


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded from stable text (not Python's salted hash), so plans repeat across runs."""
    digest = hashlib.sha256("/".join(str(part) for part in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def choose_rank(requested: int | str, world_size: int, rng: random.Random) -> int:
    if requested == "random":
        return rng.randrange(world_size)
    rank = int(requested)
    if not 0 <= rank < world_size:
        raise ValueError(f"fault targets rank {rank} but the run has ranks 0..{world_size - 1}")
    return rank
