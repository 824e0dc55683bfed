"""Issue 23, item 6: resilience objectives (the spec's ``slo:``) checked against what the drill
measured, one result per run and bound, and written as JUnit XML that validates against the format
CI systems read (tests/recorded/junit.xsd). The README's quick drill's report (recorded) is the
measured side."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.report.junit import write_junit
from orchestrator.report.slo import evaluate

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).resolve().parents[1] / "recorded"


def _quick() -> dict[str, Any]:
    return json.loads((RECORDED / "report_quick.json").read_text())


def test_each_bound_is_met_or_missed_with_what_was_measured() -> None:
    runs = _quick()["runs"]  # r000: a kill-rank recovery, ttr 4.555 s, 0.105 s lost, identical; its twin
    results = evaluate([{"name": "a rank's loss", "kind": "kill-rank", "ttr_s": 60, "lost_s": 0.05},
                        {"identical": True}, {"kind": "node-crash", "ttr_s": 60}], runs)
    said = {(result.objective, result.bound): result for result in results}
    assert [result.run_id for result in results] == ["r000"] * 4, "the twin is no run an objective is about"
    ttr, lost = said[("a rank's loss", "ttr_s <= 60")], said[("a rank's loss", "lost_s <= 0.05")]
    assert ttr.met and ttr.measured == pytest.approx(4.555, abs=1e-3)
    assert not lost.met and "missed: lost_s 0.105" in lost.why
    assert said[("every run", "identical to its twin")].met
    crash = said[("kind node-crash", "ttr_s <= 60")]
    assert not crash.met and crash.measured is None and crash.why.startswith("not measured"), crash


def test_an_objective_is_about_a_strategy_and_goodput_is_a_least() -> None:
    runs = _quick()["runs"]
    [warm] = evaluate([{"strategy": "warm", "ttr_s": 1}], runs)
    assert warm.run_id == "-" and not warm.met, "no run of the strategy it names: nothing showed it met"
    [good] = evaluate([{"goodput": 0.1}], runs)
    assert good.met and good.measured == pytest.approx(runs[0]["goodput"])
    differs = copy.deepcopy(runs)
    differs[0]["identical_to_baseline"] = False
    [same] = evaluate([{"identical": True}], differs)
    assert not same.met and same.why == "missed: differs from its twin"


def test_a_spec_objective_must_bound_something_known(tmp_path: Path) -> None:
    base = {"name": "t", "workdir": str(tmp_path / "w")}
    with pytest.raises(SpecError, match="at least one bound"):
        parse_campaign({**base, "slo": [{"kind": "kill-rank"}]}, base_dir=tmp_path)
    with pytest.raises(SpecError, match="slo.0.ttr_s"):
        parse_campaign({**base, "slo": [{"ttr_s": -1}]}, base_dir=tmp_path)
    with pytest.raises(SpecError, match="slo.0.failure_class"):
        parse_campaign({**base, "slo": [{"failure_class": "NODE_CRASH", "ttr_s": 5}]}, base_dir=tmp_path)


def test_the_junit_report_has_a_case_per_run_and_bound_and_validates(tmp_path: Path) -> None:
    report = _quick()
    report["slo"] = [result.to_dict() for result in evaluate(
        [{"name": "a rank's loss", "kind": "kill-rank", "ttr_s": 60, "lost_s": 0.05}, {"identical": True}],
        report["runs"])]
    path = write_junit(report, tmp_path / "out" / "slo.xml")
    schema = xmlschema.XMLSchema(RECORDED / "junit.xsd")
    schema.validate(path)
    document = schema.to_dict(path)
    [suite] = document["testsuite"]
    assert (suite["@tests"], suite["@failures"]) == (3, 1), suite
    failed = [case for case in suite["testcase"] if "failure" in case]
    assert [case["@name"] for case in failed] == ["a rank's loss: lost_s <= 0.05"]
    assert failed[0]["@classname"] == "quick.r000" and "lost_s 0.105" in failed[0]["failure"]["@message"]
    assert not list((tmp_path / "out").glob(".*")), "written whole, then renamed"


def test_a_run_that_failed_misses_its_recovery_bounds_and_odd_characters_stay_valid_xml(tmp_path: Path) -> None:
    """Review: one recovery of 4.6 s, then a failure never recovered from: the bounds read 'met'. And
    an objective named with a control character made the JUnit file unreadable."""
    report = _quick()
    report["runs"][0]["status"] = "failed"
    [ttr] = evaluate([{"name": "odd \x1b name", "ttr_s": 60}], report["runs"])
    assert not ttr.met and "the run failed" in ttr.why, ttr
    report["slo"] = [ttr.to_dict()]
    path = write_junit(report, tmp_path / "slo.xml")
    xmlschema.XMLSchema(RECORDED / "junit.xsd").validate(path)
