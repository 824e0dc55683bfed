"""The spec's resilience objectives (orchestrator/campaign/slo.py) against what the drill measured:
one result per run and bound, with the value measured and whether it was met. A bound with nothing
to measure (no recovery of the kind it names: the fault never fired, or was refused) is missed:
an objective nothing showed met does not pass a gate."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.campaign.slo import RECOVERY_BOUNDS, Objective


@dataclass(frozen=True)
class SloResult:
    objective: str  # its name, or what it is about
    run_id: str
    bound: str  # "ttr_s <= 60", "identical", "goodput >= 0.9"
    measured: float | bool | None  # the worst of the run's recoveries it is about; None: nothing measured
    met: bool
    why: str  # in words

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(objectives: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[SloResult]:
    """Every objective (as the ledger's copy of the spec holds it) against every run it is about."""
    results = []
    for raw in objectives:
        objective = Objective.model_validate(raw)
        about = [run for run in runs if not run["is_baseline"]
                 and (objective.strategy is None or run["strategy"] == objective.strategy.value)]
        for run in about:
            for name, bound in objective.bounds().items():
                results.append(_result(objective, run, name, bound))
        if not about:
            results += [SloResult(objective.label(), "-", _said(name, bound), None, False,
                                  "no run of the drill is one it is about") for name, bound in objective.bounds().items()]
    return results


def _result(objective: Objective, run: dict[str, Any], name: str, bound: float | bool) -> SloResult:
    label, said = objective.label(), _said(name, bound)
    if name in RECOVERY_BOUNDS and run["status"] != "completed":  # a failure it never recovered from
        return SloResult(label, run["run_id"], said, None, False,
                         f"missed: the run {run['status']} (a failure it did not recover from)")
    if name in RECOVERY_BOUNDS:
        recoveries = [recovery for recovery in run["recoveries"]
                      if (objective.kind is None or recovery["fault_kind"] == objective.kind)
                      and (objective.failure_class is None or recovery["failure_class"] == objective.failure_class.value)]
        if not recoveries:
            return SloResult(label, run["run_id"], said, None, False,
                             "not measured: the run has no recovery it is about (the fault did not fire, or did not "
                             "end its attempt)")
        worst = max(float(recovery[name]) for recovery in recoveries)
        met = worst <= float(bound)
        return SloResult(label, run["run_id"], said, worst, met,
                         f"{'met' if met else 'missed'}: {name} {_number(worst)} (the worst of {len(recoveries)} "
                         f"recovery(ies)) against at most {_number(float(bound))}")
    if name == "identical":
        identical = run.get("identical_to_baseline")
        return SloResult(label, run["run_id"], said, identical, identical is True,
                         "met: ends bit for bit as its twin" if identical is True else
                         "missed: differs from its twin" if identical is False else
                         "not measured: nothing was compared with a twin (baseline: true, or workload.outputs)")
    value = run.get("goodput")
    if value is None:
        return SloResult(label, run["run_id"], said, None, False, "not measured: the run has no step time or end")
    met = float(value) >= float(bound)
    return SloResult(label, run["run_id"], said, value, met,
                     f"{'met' if met else 'missed'}: goodput {float(value):.3f} against at least {float(bound):g}")


def _said(name: str, bound: float | bool) -> str:
    if name == "identical":
        return "identical to its twin"
    return f"{name} >= {bound:g}" if name == "goodput" else f"{name} <= {_number(float(bound))}"


def _number(value: float) -> str:
    return f"{value:.0f}" if value.is_integer() else f"{value:.3g}"
