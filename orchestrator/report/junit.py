"""The SLO results as a JUnit XML report (one test case per run and bound), which GitLab, Jenkins
and GitHub show natively: a missed bound is a failure with its measured value, one with nothing
to measure a failure too (an objective nothing showed met)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

# What XML 1.0 cannot hold (control characters but tab, newline, carriage return; surrogates; FFFE, FFFF).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: object) -> str:
    return _NOT_XML.sub("?", str(text))


def junit_document(report: dict[str, Any]) -> ElementTree.ElementTree:
    results = report.get("slo") or []
    failures = sum(1 for result in results if not result["met"])
    suites = ElementTree.Element("testsuites", name=f"faultdrill {report['campaign']}", tests=str(len(results)),
                                failures=str(failures), errors="0", time="0")
    suite = ElementTree.SubElement(suites, "testsuite", name=f"faultdrill.slo.{report['campaign']}",
                                   tests=str(len(results)), failures=str(failures), errors="0", skipped="0",
                                   time="0")
    for result in results:
        case = ElementTree.SubElement(suite, "testcase", classname=_x(f"{report['campaign']}.{result['run_id']}"),
                                      name=_x(f"{result['objective']}: {result['bound']}"), time="0")
        if not result["met"]:
            failure = ElementTree.SubElement(case, "failure", type="slo-missed", message=_x(result["why"]))
            failure.text = f"measured: {result['measured']}"
        ElementTree.SubElement(case, "system-out").text = _x(result["why"])
    ElementTree.indent(suites)
    return ElementTree.ElementTree(suites)


def write_junit(report: dict[str, Any], path: Path) -> Path:
    """Written whole or not at all (a temporary file, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    junit_document(report).write(temporary, encoding="utf-8", xml_declaration=True)
    os.replace(temporary, path)
    return path
