"""Which ranks a rank fault hits: one, a random one, a list, or a fraction of them at once."""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RankFraction(BaseModel):
    """``{fraction: 0.5}``: that share of the ranks (at least one), drawn at random, hit together."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    fraction: float = Field(gt=0, le=1)


RankSelector = int | Literal["random"] | list[int] | RankFraction


def choose_ranks(selector: RankSelector, world_size: int, rng: random.Random) -> tuple[int, ...]:
    """The ranks ``selector`` names in a job of ``world_size`` ranks (sorted, no repeats)."""
    problem = rank_problem(selector, world_size)
    if problem:
        raise ValueError(problem)
    if selector == "random":
        return (rng.randrange(world_size),)
    if isinstance(selector, RankFraction):
        count = max(1, math.floor(selector.fraction * world_size + 1e-9))
        return tuple(sorted(rng.sample(range(world_size), count)))
    if isinstance(selector, int):
        return (selector,)
    return tuple(sorted(set(selector)))


def rank_problem(selector: RankSelector, world_size: int) -> str | None:
    """Why ``selector`` names ranks a job of ``world_size`` ranks does not have, or None."""
    named = [selector] if isinstance(selector, int) else selector if isinstance(selector, list) else []
    if isinstance(selector, list) and not selector:
        return "an empty list of ranks"
    outside = [rank for rank in named if not 0 <= rank < world_size]
    if outside:
        return f"targets rank {outside[0]}, but a run has ranks 0..{world_size - 1}"
    return None
