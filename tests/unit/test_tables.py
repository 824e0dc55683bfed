"""The report's tables print what the ledger holds as plain text: reasons and details quote
framework errors such as gloo's "[/__w/pytorch/.../pair.cc:537]", which rich would take for markup
(the paper study's `faultdrill report` failed on one)."""

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
    assert "[/__w/pytorch/third_party/gloo/pair.cc:537]" in text and "rank [1]@fd-n2" in text
