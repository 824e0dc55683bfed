"""The report's tables print what the ledger holds as plain text: targets and details may hold what
rich would take for markup ("rank [1]", gloo's "[/__w/pytorch/.../pair.cc:537]": the paper study's
`faultdrill report` failed on one). A detail is shown shortened to its cause (no source location:
tests/unit/test_report_terminal.py); a bracket that remains is printed as it is."""

from __future__ import annotations

from rich.console import Console

from orchestrator.report.tables import faults_table

GLOO = "caused: attempt 0 failed; rank 0: RuntimeError: [/__w/pytorch/third_party/gloo/pair.cc:537] Connection closed"


def test_a_detail_that_looks_like_markup_is_printed_as_it_is() -> None:
    report = {"runs": [{"run_id": "r000", "faults": [{
        "kind": "kill-rank", "target": "rank [1]@fd-n2", "attempt": 0, "planned_delay_s": 0.0,
        "outcome": "injected", "detail": GLOO}]}]}
    console = Console(record=True, width=400)
    console.print(faults_table(report))
    text = console.export_text()
    assert "rank [1]@fd-n2" in text and "RuntimeError: Connection closed" in text
    assert "[/__w/" not in text, "the source location is no cause: shortened away"
