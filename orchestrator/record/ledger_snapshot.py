"""A read-only command's view of a drill's ledger (report, status, project): a copy made through
SQLite's backup from a read-only connection, opened (an older version's ledger brought up to this version's columns) in
a directory of its own. The drill's own file is never written: an archived workdir on a read-only
mount, a colleague's shared one, an older version's ledger stay as they were."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from orchestrator.record.ledger import Ledger
from orchestrator.record.ledger_home import LEDGER_NAME, ledger_path

# A file SQLite keeps beside the database while it writes: the copy takes them too, so that SQLite
# finishes or rolls back, on the copy, what the drill's controller was writing.
JOURNAL_SUFFIXES = ("-journal", "-wal")


class LedgerUnreadable(RuntimeError):
    """The ledger exists but cannot be read (not a database, no permission)."""


@contextmanager
def ledger_snapshot(workdir: Path) -> Iterator[Ledger]:
    """The workdir's ledger as it stands, copied; the copy is removed on exit."""
    source = ledger_path(workdir)
    with tempfile.TemporaryDirectory(prefix="faultdrill-ledger-") as scratch:
        copy = Path(scratch) / LEDGER_NAME
        _copy(source, copy)
        ledger = Ledger(copy)
        try:
            yield ledger
        finally:
            ledger.close()


def _copy(source: Path, copy: Path) -> None:
    """SQLite's backup from a read-only connection (a consistent copy while a drill writes); where
    that cannot be made (a read-only directory that cannot hold the WAL's shared memory, a journal
    left by a controller that died mid-write that a read-only connection may not roll back), the
    files themselves: the database and its journal, which SQLite rolls back or replays on the copy
    when it is opened."""
    if not source.exists():
        raise LedgerUnreadable(f"{source}: no such file")
    try:
        _backup(source, copy)
        return
    except sqlite3.Error:
        copy.unlink(missing_ok=True)
    try:
        shutil.copyfile(source, copy)
        for suffix in JOURNAL_SUFFIXES:
            journal = source.with_name(source.name + suffix)
            if journal.exists():
                shutil.copyfile(journal, copy.with_name(copy.name + suffix))
        with sqlite3.connect(copy) as check:
            check.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except (OSError, sqlite3.Error) as error:
        raise LedgerUnreadable(f"{source}: the drill's ledger cannot be read ({error})") from None


def _backup(source: Path, copy: Path) -> None:
    reader = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    try:
        writer = sqlite3.connect(copy)
        try:
            reader.backup(writer)
        finally:
            writer.close()
    finally:
        reader.close()
