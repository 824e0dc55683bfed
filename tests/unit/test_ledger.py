"""The ledger keeps every fact across connections (a controller restarted picks up from it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from experiments.layout import CheckpointRecord
from orchestrator.record.ledger import FaultRow, Ledger, RunRow


def test_rows_survive_reopening_and_duplicates_are_ignored(tmp_path: Path) -> None:
    ledger = Ledger.in_workdir(tmp_path)
    ledger.set_meta("drill_id", "d-1")
    run = RunRow(run_id="r000", framework="torch", ranks=2, nodes=1, strategy="resubmit", target_steps=10,
                 baseline_of=None, config="{}")
    ledger.add_run(run)
    ledger.add_run(run)
    ledger.add_attempt("r000", 0)
    ledger.update_attempt("r000", 0, job_id="17", state="RUNNING", accepted=5.0)
    fault_id = ledger.add_fault(FaultRow(None, "r000", 0, 0, "kill-rank", "rank 1", "SIGKILL", 1.0, None, None,
                                         None, "sending"))
    ledger.update_fault(fault_id, at=6.0, pid=123, outcome="injected")
    record = CheckpointRecord(step=5, attempt=0, path="p", time=5.5, bytes=100, files={"a": "00"},
                              framework="torch", format="f", writers="rank0", blocking_s=0.1, persist_s=0.2)
    ledger.add_checkpoints("r000", [record, record])
    ledger.close()

    again = Ledger.in_workdir(tmp_path)
    assert again.meta("drill_id") == "d-1"
    assert [r.run_id for r in again.runs()] == ["r000"]
    attempt = again.attempts("r000")[0]
    assert (attempt.job_id, attempt.state, attempt.accepted) == ("17", "RUNNING", 5.0)
    fault = again.faults("r000")[0]
    assert (fault.at, fault.pid, fault.outcome) == (6.0, 123, "injected")
    assert again.checkpoints("r000") == [record]
    again.close()
    with sqlite3.connect(tmp_path / "ledger.sqlite") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
