"""The ledger keeps every fact across connections (a controller restarted picks up from it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

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
                              framework="torch", format="f", writers="rank0", blocking_s=0.1, persist_s=0.2, hash_algorithm="blake3")
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


NFS_MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:20 - nfs4 filer:/export/home rw,vers=4.2
"""


def test_the_ledger_keeps_a_rollback_journal_on_a_network_filesystem(tmp_path, monkeypatch) -> None:
    """Issue 22, item 3: SQLite's WAL is unsafe over NFS (its index is shared memory of one host);
    a workdir on a network filesystem gets a rollback journal, a local one WAL."""
    from orchestrator.record import ledger as ledger_module
    from orchestrator.record.ledger import journal_mode

    assert journal_mode(Path("/home/me/work/ledger.sqlite"), NFS_MOUNTINFO) == "DELETE"
    assert journal_mode(Path("/scratch/me/work/ledger.sqlite"), NFS_MOUNTINFO) == "WAL"
    for network, mode in ((False, "wal"), (True, "delete")):
        monkeypatch.setattr(ledger_module, "on_network_filesystem", lambda _path, _mountinfo=None, network=network: network)
        ledger = Ledger(tmp_path / mode / "ledger.sqlite")
        try:
            assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == mode
        finally:
            ledger.close()


def test_a_ledger_open_elsewhere_keeps_its_journal_when_it_already_has_the_one_wanted(tmp_path, monkeypatch) -> None:
    """Review of issue 22 (ledger journal): the mode is read first and switched only on a mismatch, so
    a ledger that another connection holds open (``faultdrill status``, a report) opens at once."""
    from orchestrator.record import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "on_network_filesystem", lambda _path, _mountinfo=None: True)
    Ledger.in_workdir(tmp_path).close()  # made with a rollback journal
    other = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        other.execute("SELECT count(*) FROM runs").fetchall()
        ledger = Ledger.in_workdir(tmp_path)
        assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        ledger.close()
    finally:
        other.close()


def test_a_journal_switch_waits_for_other_connections_then_refuses_naming_them(tmp_path, monkeypatch) -> None:
    """Review of issue 22 (ledger journal): WAL -> DELETE needs the database to itself. Another
    connection open: the switch is retried until a deadline, then refused with what to do, and the
    ledger's own connection is closed; one that closes within the deadline lets the switch happen."""
    from orchestrator.record import ledger as ledger_module

    Ledger.in_workdir(tmp_path).close()  # made with WAL (a local filesystem)
    monkeypatch.setattr(ledger_module, "on_network_filesystem", lambda _path, _mountinfo=None: True)
    monkeypatch.setattr(ledger_module, "JOURNAL_SWITCH_S", 0.2)
    opened: list[sqlite3.Connection] = []
    connect = sqlite3.connect
    monkeypatch.setattr(ledger_module.sqlite3, "connect", lambda *a, **k: opened.append(connect(*a, **k)) or opened[-1])
    other = connect(tmp_path / "ledger.sqlite")
    other.execute("SELECT count(*) FROM runs").fetchall()
    try:
        with pytest.raises(ledger_module.LedgerBusy, match="close the other faultdrill processes"):
            Ledger.in_workdir(tmp_path)
        with pytest.raises(sqlite3.ProgrammingError):  # closed: no connection leaks
            opened[-1].execute("SELECT 1")
        retries: list[float] = []

        def close_other(seconds: float) -> None:
            retries.append(seconds)
            other.close()

        monkeypatch.setattr(ledger_module.time, "sleep", close_other)
        ledger = Ledger.in_workdir(tmp_path)
        assert retries and ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        ledger.close()
    finally:
        other.close()


def test_a_ledger_file_linked_onto_a_network_filesystem_gets_a_rollback_journal(tmp_path) -> None:
    """Review of issue 22 (ledger journal): the ledger file itself is resolved, not only its folder."""
    from orchestrator.record.ledger import journal_mode

    local, shared = tmp_path / "local", tmp_path / "nfs"
    local.mkdir()
    shared.mkdir()
    (local / "ledger.sqlite").symlink_to(shared / "ledger.sqlite")
    mountinfo = f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:50 / {shared} rw - nfs4 srv:/export rw\n"
    assert journal_mode(local / "ledger.sqlite", mountinfo) == "DELETE"
