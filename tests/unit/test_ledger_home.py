"""Issue 22 item 3: the ledger kept on the login node's local disk (``ledger_dir``) while the drill
runs, found through the workdir's pointer, told as elsewhere on another host, and brought into the
workdir when the drill ends (the pointer and the local copy removed)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from orchestrator.record.ledger import Ledger
from orchestrator.record.ledger_home import (
    LEDGER_NAME,
    POINTER_NAME,
    LedgerElsewhere,
    bring_home,
    has_ledger,
    ledger_path,
    place_ledger,
)

pytestmark = pytest.mark.unit


def test_a_ledger_in_ledger_dir_is_found_through_the_pointer_and_brought_home_at_the_end(tmp_path: Path) -> None:
    workdir, local = tmp_path / "work", tmp_path / "local"
    workdir.mkdir()
    assert not has_ledger(workdir) and place_ledger(workdir, None) == workdir / LEDGER_NAME
    path = place_ledger(workdir, local)
    assert path.parent == local and json.loads((workdir / POINTER_NAME).read_text())["host"] == socket.gethostname()
    assert ledger_path(workdir) == path and has_ledger(workdir) and place_ledger(workdir, local) == path
    ledger = Ledger(path)
    ledger.set_meta("finished", 1.0)
    ledger.close()
    assert Ledger.in_workdir(workdir).meta("finished") == 1.0, "commands follow the pointer"
    assert bring_home(workdir) == workdir / LEDGER_NAME
    assert not (workdir / POINTER_NAME).exists() and list(local.iterdir()) == []
    assert ledger_path(workdir) == workdir / LEDGER_NAME and Ledger(workdir / LEDGER_NAME).meta("finished") == 1.0
    assert bring_home(workdir) is None, "nothing to bring: the ledger lives in the workdir"


def test_a_ledger_kept_on_another_host_is_said_to_be_there(tmp_path: Path) -> None:
    (tmp_path / POINTER_NAME).write_text(json.dumps({"path": "/var/fd/work-1.sqlite", "host": "login2"}))
    with pytest.raises(LedgerElsewhere, match="kept on login2's local disk .* run this command on login2"):
        ledger_path(tmp_path)
    (tmp_path / POINTER_NAME).write_text("{not json")
    with pytest.raises(LedgerElsewhere, match="unreadable"):
        ledger_path(tmp_path)


def test_a_pointer_left_by_a_controller_that_ended_while_bringing_it_home_reads_the_copy(tmp_path: Path) -> None:
    """Crash window: the copy renamed into the workdir, the local file gone, the pointer not yet removed."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    path = place_ledger(workdir, tmp_path / "local")
    Ledger(workdir / LEDGER_NAME).close()
    assert not path.exists() and ledger_path(workdir) == workdir / LEDGER_NAME
