"""Where a drill's ledger lives. In the workdir by default (``ledger.sqlite``). A spec may name a
``ledger_dir`` on the login node's local disk instead, for a workdir on a network filesystem: SQLite
there is only as safe as its locks (a rollback journal, never WAL), and a busy ledger's every write
is a round trip. The workdir then holds a pointer (``ledger-home.json``: the file and the host that
keeps it), every command finds the ledger through it, and when the drill ends its ledger is copied
into the workdir and the pointer removed: the record lives with the runs, readable from anywhere.

A command on another host than the one keeping the ledger is told where it is: it cannot read it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
from pathlib import Path

from experiments.layout import write_json_atomic

LEDGER_NAME = "ledger.sqlite"
POINTER_NAME = "ledger-home.json"


class LedgerElsewhere(RuntimeError):
    """The workdir's ledger is kept on another host's local disk while the drill runs."""


def ledger_path(workdir: Path) -> Path:
    """The workdir's ledger: where its pointer says while the drill runs, else ``ledger.sqlite``."""
    pointer = _read_pointer(workdir)
    if pointer is None:
        return workdir / LEDGER_NAME
    path, host = Path(pointer["path"]), str(pointer["host"])
    if host != socket.gethostname():
        raise LedgerElsewhere(f"{workdir}: while its drill runs, its ledger is kept on {host}'s local disk ({path}, "
                              f"the spec's ledger_dir): run this command on {host}")
    if not path.exists() and (workdir / LEDGER_NAME).exists():
        return workdir / LEDGER_NAME  # copied back; the pointer was not removed yet
    return path


def has_ledger(workdir: Path) -> bool:
    """A campaign workdir: its ledger is there (or named by its pointer)."""
    return (workdir / POINTER_NAME).exists() or (workdir / LEDGER_NAME).exists()


def place_ledger(workdir: Path, ledger_dir: Path | None) -> Path:
    """The ledger a drill in ``workdir`` opens: in ``ledger_dir`` (a file named for the workdir,
    the pointer written first), else in the workdir. A drill resumed keeps the one it had."""
    if ledger_dir is None or _read_pointer(workdir) is not None:
        return ledger_path(workdir)
    ledger_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    resolved = workdir.resolve()
    path = ledger_dir / f"{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}.sqlite"
    write_json_atomic(workdir / POINTER_NAME, {"path": str(path), "host": socket.gethostname()})
    return path


def bring_home(workdir: Path) -> Path | None:
    """A finished drill's ledger copied from ``ledger_dir`` into the workdir (SQLite's backup, into a
    temporary file, then renamed), the pointer removed, the local copy deleted; where it went, or
    None where the ledger already lives in the workdir."""
    pointer = _read_pointer(workdir)
    if pointer is None:
        return None
    source, target = Path(pointer["path"]), workdir / LEDGER_NAME
    if source.exists():
        temporary = workdir / f".{LEDGER_NAME}.{os.getpid()}"
        with sqlite3.connect(source) as src, sqlite3.connect(temporary) as dst:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
        src.close()
        dst.close()
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    (workdir / POINTER_NAME).unlink(missing_ok=True)
    for leftover in (source, source.with_name(f"{source.name}-wal"), source.with_name(f"{source.name}-shm")):
        leftover.unlink(missing_ok=True)
    return target


def _read_pointer(workdir: Path) -> dict[str, str] | None:
    try:
        found = json.loads((workdir / POINTER_NAME).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise LedgerElsewhere(f"{workdir / POINTER_NAME} is unreadable: it names where the drill's ledger is "
                              "kept") from None
    if not isinstance(found, dict) or "path" not in found or "host" not in found:
        raise LedgerElsewhere(f"{workdir / POINTER_NAME} does not name a ledger and its host")
    return found
