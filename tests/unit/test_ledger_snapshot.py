"""The read-only commands' copy of a drill's ledger (orchestrator/record/ledger_snapshot.py): the
drill's file is never written, and what a controller that died mid-write left half done is rolled
back on the copy, never read (helper 49: a fallback read the torn file as it stood)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.record.ledger import Ledger, RunRow
from orchestrator.record.ledger_snapshot import ledger_snapshot

pytestmark = pytest.mark.unit

def _ledger(workdir: Path, journal: str) -> Path:
    ledger = Ledger.in_workdir(workdir)
    for index in range(2000):
        ledger.add_run(RunRow(run_id=f"r{index:04d}", framework="torch", ranks=2, nodes=1, strategy="resubmit",
                              target_steps=10, baseline_of=None, config="{}"))
    ledger.close()
    path = workdir / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA journal_mode={journal}")
    db.close()
    return path


def _torn(source: Path, workdir: Path) -> Path:
    """``workdir`` as a controller killed mid-transaction leaves it: its changes spilled into the
    database file, its journal beside it (hot: no process holds the lock any more)."""
    workdir.mkdir()
    db = sqlite3.connect(source, isolation_level=None)
    db.execute("PRAGMA cache_size = 1")  # the changes go to the file before the commit
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE runs SET status = 'torn', config = ?", ("x" * 500,))
    for name in ("ledger.sqlite", "ledger.sqlite-journal"):
        shutil.copyfile(source.with_name(name), workdir / name)
    db.execute("ROLLBACK")
    db.close()
    return workdir / "ledger.sqlite"


def test_a_write_torn_by_a_dead_controller_is_rolled_back_on_the_copy(tmp_path: Path) -> None:
    path = _torn(_ledger(tmp_path / "work", "DELETE"), tmp_path / "crashed")  # a ledger_dir's: a rollback journal
    torn = sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True)
    assert {row[0] for row in torn.execute("SELECT status FROM runs")} != {"pending"}, "the file itself is torn"
    torn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with ledger_snapshot(tmp_path / "crashed") as ledger:
        statuses = {run.status for run in ledger.runs()}
    assert statuses == {"pending"}, statuses
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "the drill's own file was not touched"
