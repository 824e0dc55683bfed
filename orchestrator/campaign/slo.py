"""Resilience service-level objectives (the spec's ``slo:``): what a site or a training team wants
to hold on every change of its stack ("a node crash recovers in under 60 s and loses under 5
minutes of work"), checked at the end of a drill (orchestrator/report/slo.py), a CI gate.

Each objective may name what it is about — the recoveries from a fault ``kind``, of a
``failure_class``, of runs of a restart ``strategy`` — and holds one or more bounds: per recovery
the time to recover (``ttr_s``), the work lost (``lost_s``, ``lost_steps``), each at most; per
run ``identical`` (ends bit for bit as its twin) and ``goodput`` (useful time / elapsed, at least).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from injectors.kinds import REGISTRY
from orchestrator.campaign.failure_classes import FailureClass
from orchestrator.campaign.strategies import StrategyName

RECOVERY_BOUNDS = ("ttr_s", "lost_s", "lost_steps")  # at most, for every recovery it is about
RUN_BOUNDS = ("identical", "goodput")  # for every run it is about


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, max_length=120, description="how reports name it (default: its bounds)")
    kind: str | None = Field(None, description="the recoveries from faults of this kind only")
    failure_class: FailureClass | None = Field(None, description="the recoveries of this failure class only")
    strategy: StrategyName | None = Field(None, description="the runs of this restart strategy only")
    ttr_s: float | None = Field(None, gt=0, description="time to recover, seconds, at most")
    lost_s: float | None = Field(None, ge=0, description="work lost per recovery, seconds, at most")
    lost_steps: int | None = Field(None, ge=0, description="work lost per recovery, steps, at most")
    identical: bool | None = Field(None, description="true: every run ends bit for bit as its twin")
    goodput: float | None = Field(None, gt=0, le=1, description="useful time / elapsed per run, at least")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str | None) -> str | None:
        if value is not None and value not in REGISTRY:
            raise ValueError(f"unknown fault kind {value!r}; valid: {', '.join(sorted(REGISTRY))}")
        return value

    @model_validator(mode="after")
    def _bounds_something(self) -> "Objective":
        if not self.bounds():
            raise ValueError(f"an objective holds at least one bound: {', '.join((*RECOVERY_BOUNDS, *RUN_BOUNDS))}")
        if self.identical is False:
            raise ValueError("identical: true, or leave it out (false is no objective)")
        return self

    def bounds(self) -> dict[str, float | bool]:
        """The bounds it holds, by name."""
        return {name: value for name in (*RECOVERY_BOUNDS, *RUN_BOUNDS) if (value := getattr(self, name)) is not None}

    def label(self) -> str:
        about = [f"{key} {value}" for key, value in (("kind", self.kind), ("class", self.failure_class and
                                                                             self.failure_class.value),
                                                     ("strategy", self.strategy and self.strategy.value)) if value]
        return self.name or " ".join(about) or "every run"
