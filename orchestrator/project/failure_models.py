"""Failure models as data (issue 25): how often a job of N GPUs fails, and what each failure is.

A model is a YAML file (``experiments/failure-models/NAME.yaml``, or a user's own path): its
``source``, its rate (``rate``: a count of failures over days at a number of GPUs, i.e. a rate per
GPU-hour; or ``mttf_curve``: the mean time to failure at a few job sizes, interpolated on log-log
axes and extrapolated with the end slopes), and its ``causes``, each with a ``count`` (its share),
whether it ``takes_node`` (the node leaves the job: a spare is needed) and the ``failure_class`` a
drill gives it (orchestrator/campaign/failure_classes.py: which measured recoveries stand for it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.campaign.failure_classes import FailureClass

MODELS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "failure-models"


class FailureModelError(ValueError):
    """A failure model that cannot be read: its path and what is wrong."""


class Cause(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    count: float = Field(gt=0)
    takes_node: bool
    failure_class: FailureClass


class CountedRate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    failures: float = Field(gt=0)
    days: float = Field(gt=0)
    gpus: int = Field(gt=0)


class CurvePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(gt=0)
    mttf_h: float = Field(gt=0)


class FailureModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    source: str
    rate: CountedRate | None = None
    mttf_curve: list[CurvePoint] | None = None
    causes: list[Cause] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_rate(self) -> "FailureModel":
        if (self.rate is None) == (self.mttf_curve is None):
            raise ValueError("give its rate as exactly one of rate (failures, days, gpus) and mttf_curve")
        if self.mttf_curve is not None:
            sizes = [point.gpus for point in self.mttf_curve]
            if len(sizes) < 2 or sizes != sorted(set(sizes)):
                raise ValueError("mttf_curve needs two or more points, in growing gpus")
        return self

    def mttf_h(self, gpus: int) -> float:
        """The mean time to failure of a job on ``gpus`` GPUs, in hours."""
        if self.rate is not None:
            per_gpu_hour = self.rate.failures / (self.rate.days * 24 * self.rate.gpus)
            return 1 / (per_gpu_hour * gpus)
        assert self.mttf_curve is not None
        points = self.mttf_curve
        logs = [(math.log(point.gpus), math.log(point.mttf_h)) for point in points]
        x = math.log(gpus)
        index = 1
        while index < len(logs) - 1 and x > logs[index][0]:
            index += 1
        (x0, y0), (x1, y1) = logs[index - 1], logs[index]
        return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    @property
    def node_share(self) -> float:
        """The share of failures that take their node out of the job."""
        return sum(cause.count for cause in self.causes if cause.takes_node) / sum(c.count for c in self.causes)

    def class_shares(self, takes_node: bool) -> dict[str, float]:
        """Of the failures that take a node (or of those that do not), the share of each failure class."""
        chosen = [cause for cause in self.causes if cause.takes_node == takes_node]
        total = sum(cause.count for cause in chosen)
        shares: dict[str, float] = {}
        for cause in chosen:
            shares[cause.failure_class.value] = shares.get(cause.failure_class.value, 0.0) + cause.count / total
        return shares


def shipped_models() -> list[str]:
    return sorted(path.stem for path in MODELS_DIR.glob("*.yaml"))


def load_failure_model(name_or_path: str) -> FailureModel:
    """A shipped model by name (``meta-rsc``, ``llama3``) or a YAML file of the same form."""
    path = MODELS_DIR / f"{name_or_path}.yaml" if name_or_path in shipped_models() else Path(name_or_path)
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FailureModelError(f"--failure-model {name_or_path}: no such model or file; shipped: "
                                f"{', '.join(shipped_models())}") from None
    except (OSError, yaml.YAMLError) as error:
        raise FailureModelError(f"{path}: not a readable YAML file ({error})") from None
    try:
        return FailureModel.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in error.errors())
        raise FailureModelError(f"{path}: {problems}") from None
