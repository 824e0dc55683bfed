"""A read-only command's view of a drill's ledger: a copy made through SQLite's backup from a
read-only connection, opened (an older version's ledger brought up to this version's columns) in
a directory of its own. The drill's own file is never written: an archived workdir on a read-only
mount, a colleague's shared one, an older version's ledger stay as they were."""

from __future__ import annotations

import sqlite3
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from orchestrator.record.ledger import Ledger
from orchestrator.record.ledger_home import LEDGER_NAME, ledger_path

# mode=ro reads the journal as SQLite does; immutable=1 where a read-only directory cannot hold the
# WAL's shared-memory file (then a drill that is still writing is read as its file stands).
READ_ONLY_URIS = ("mode=ro", "immutable=1")


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
    why = "no such file"
    if source.exists():
        for query in READ_ONLY_URIS:
            try:
                reader = sqlite3.connect(f"{source.resolve().as_uri()}?{query}", uri=True)
                try:
                    writer = sqlite3.connect(copy)
                    try:
                        reader.backup(writer)
                        return
                    finally:
                        writer.close()
                finally:
                    reader.close()
            except sqlite3.Error as error:
                why = str(error)
                copy.unlink(missing_ok=True)
    raise LedgerUnreadable(f"{source}: the drill's ledger cannot be read ({why})")
