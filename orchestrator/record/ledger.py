"""The ledger: every fact the report needs, as rows in SQLite in the campaign's workdir (its
write-ahead log, WAL, on a local filesystem; a rollback journal on a network filesystem, where WAL's
shared memory index is not shared between hosts and SQLite does not support it).

The controller writes a row before it acts (an attempt before its submission, a fault before it is
sent) so that a controller killed at any moment can pick up from here without duplicating work.
Writes that belong together (an attempt ended and its run completed) go in one transaction, and
every commit is durable (synchronous=FULL: with WAL, NORMAL may lose the last commits on a host crash,
and the last commit is often the row written just before a submission).
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterator, TypeVar

from experiments.layout import CheckpointRecord
from experiments.runtime.mounts import on_network_filesystem
from orchestrator.record.ledger_home import (  # noqa: F401  # LEDGER_NAME: imported from here too
    LEDGER_NAME,
    ledger_path,
)

JOURNAL_SWITCH_S = 10.0  # how long a journal switch waits for other connections to close
JOURNAL_RETRY_S = 0.1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, framework TEXT NOT NULL, ranks INTEGER NOT NULL, nodes INTEGER NOT NULL,
    strategy TEXT NOT NULL, target_steps INTEGER NOT NULL, baseline_of TEXT, config TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', final_step INTEGER NOT NULL DEFAULT 0,
    final_digest TEXT NOT NULL DEFAULT '', started REAL, ended REAL,
    model TEXT NOT NULL DEFAULT 'mlp', requested_params INTEGER NOT NULL DEFAULT 0, params INTEGER,
    step_time_s REAL, determinism TEXT, max_abs_weight_diff REAL, first_divergent_step INTEGER);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, job_id TEXT, state TEXT NOT NULL,
    submitted REAL NOT NULL, accepted REAL, started REAL, ended REAL, detected REAL, reason TEXT,
    job_name TEXT, array_index INTEGER, failed_at REAL, failure_evidence TEXT, PRIMARY KEY (run_id, attempt));
CREATE TABLE IF NOT EXISTS faults (
    fault_id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    plan_index INTEGER NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL, signal TEXT NOT NULL,
    planned_delay_s REAL NOT NULL, at REAL, pid INTEGER, node TEXT, outcome TEXT NOT NULL, detail TEXT,
    UNIQUE (run_id, plan_index));
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, attempt INTEGER NOT NULL, path TEXT NOT NULL,
    time REAL NOT NULL, bytes INTEGER NOT NULL, framework TEXT NOT NULL, format TEXT NOT NULL,
    writers TEXT NOT NULL, blocking_s REAL NOT NULL, persist_s REAL NOT NULL, files TEXT NOT NULL,
    PRIMARY KEY (run_id, step, attempt));
CREATE TABLE IF NOT EXISTS recoveries (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, fault_kind TEXT NOT NULL, fault_at REAL NOT NULL,
    detect_s REAL NOT NULL, resubmit_s REAL NOT NULL, queue_s REAL NOT NULL, startup_s REAL NOT NULL,
    load_s REAL NOT NULL, first_step_s REAL NOT NULL, ttr_s REAL NOT NULL, lost_steps INTEGER NOT NULL,
    lost_s REAL NOT NULL, lost_rank_s REAL NOT NULL, resumed_from_step INTEGER NOT NULL,
    failure_evidence TEXT NOT NULL DEFAULT '', clock_correction_s REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, attempt));
"""
# Columns added since a table was first created: a ledger of an unfinished drill written by an
# older version gets them on open (ALTER TABLE ADD COLUMN), so it can still be resumed.
ADDED_COLUMNS = {
    "runs": {"twin": "TEXT", "ended_because": "TEXT", "outputs": "TEXT"},
    "attempts": {"job_name": "TEXT", "array_index": "INTEGER", "failed_at": "REAL", "failure_evidence": "TEXT",
                 "failure_class": "TEXT", "class_evidence": "TEXT", "failed_nodes": "TEXT",
                 "excluded_nodes": "TEXT", "class_facts": "TEXT", "ended_by_drill": "TEXT", "not_before": "REAL"},
    "faults": {"detail": "TEXT", "planned_step": "INTEGER", "met_step": "INTEGER"},
    "checkpoints": {"hash_algorithm": "TEXT NOT NULL DEFAULT 'sha256'"},
    "recoveries": {"failure_evidence": "TEXT NOT NULL DEFAULT ''", "clock_correction_s": "REAL NOT NULL DEFAULT 0",
                   "failure_class": "TEXT NOT NULL DEFAULT ''", "fallback_from_step": "INTEGER",
                   "fallback_lost_steps": "INTEGER NOT NULL DEFAULT 0", "class_evidence": "TEXT NOT NULL DEFAULT ''",
                   "failed_restarts": "INTEGER NOT NULL DEFAULT 0", "spare": "TEXT", "state_source": "TEXT",
                   "phase_uncertainty": "TEXT NOT NULL DEFAULT '{}'", "clock_offsets": "TEXT NOT NULL DEFAULT '{}'"},
}


@dataclass(frozen=True)
class RunRow:
    run_id: str
    framework: str
    ranks: int
    nodes: int
    strategy: str
    target_steps: int
    baseline_of: str | None
    config: str
    status: str = "pending"
    final_step: int = 0
    final_digest: str = ""
    started: float | None = None
    ended: float | None = None
    model: str = "mlp"
    requested_params: int = 0
    params: int | None = None  # exact count of the model built (framework_ready)
    step_time_s: float | None = None  # mean time inside a training step, final attempt
    determinism: str | None = None  # the switches the workload needs for a bitwise resume
    max_abs_weight_diff: float | None = None  # vs the baseline twin; 0.0 when identical
    first_divergent_step: int | None = None  # first step whose loss differs from the twin's
    twin: str | None = None  # the run id of this run's fault-free twin (shared by runs that differ in faults only)
    ended_because: str | None = None  # why a run gave up (the policy's words: the class and the budget)
    outputs: str | None = None  # the script's outputs against its twin's (orchestrator/record/outputs.py), JSON


@dataclass(frozen=True)
class AttemptRow:
    run_id: str
    attempt: int
    job_id: str | None
    state: str
    submitted: float
    accepted: float | None = None
    started: float | None = None
    ended: float | None = None
    detected: float | None = None
    reason: str | None = None
    job_name: str | None = None  # what the scheduler calls it: a restarted controller looks it up
    array_index: int | None = None  # its element in that job array, if it went out in one
    failed_at: float | None = None  # the best evidence of when it failed (see failure_evidence)
    failure_evidence: str | None = None  # step_exit | scheduler_end | last_heartbeat | poll | ...
    failure_class: str | None = None  # orchestrator.campaign.failure_classes: what kind of failure it was
    class_evidence: str | None = None  # the fact that decided the class
    failed_nodes: str | None = None  # comma-separated: the nodes it lost (a node fault, a hung rank's node)
    excluded_nodes: str | None = None  # comma-separated: the nodes it was submitted to stay off
    class_facts: str | None = None  # JSON: what the class was taken from (orchestrator.observe.failure_signs)
    # JSON (orchestrator.campaign.failure_classes.DrillEnded): after this attempt failed the drill cancelled
    # its job, which the next attempt was to run in (in-allocation: a hung launch it could not end).
    ended_by_drill: str | None = None
    not_before: float | None = None  # not submitted before this (wall time): the restart policy's backoff


@dataclass(frozen=True)
class FaultRow:
    fault_id: int | None
    run_id: str
    attempt: int
    plan_index: int
    kind: str
    target: str
    signal: str
    planned_delay_s: float
    at: float | None
    pid: int | None
    node: str | None
    outcome: str  # SENDING, INJECTED, REFUSED, ABSORBED, LATE, NOT_FIRED, UNKNOWN (orchestrator.faults.book)
    detail: str | None = None  # what it caused, or why it was refused, absorbed, late or not fired
    planned_step: int | None = None  # an at_step fault's step
    met_step: int | None = None  # the step its attempt had reached when it acted (its heartbeats)


@dataclass(frozen=True)
class RecoveryRow:
    run_id: str
    attempt: int
    fault_kind: str
    fault_at: float
    detect_s: float
    resubmit_s: float
    queue_s: float
    startup_s: float
    load_s: float
    first_step_s: float
    ttr_s: float
    lost_steps: int
    lost_s: float
    lost_rank_s: float
    resumed_from_step: int
    failure_evidence: str = ""  # where the failure time comes from: fault, step_exit, last_heartbeat, ...
    clock_correction_s: float = 0.0  # how far node timestamps were moved to keep every phase >= 0
    failure_class: str = ""  # the failed attempt's class (orchestrator.campaign.failure_classes)
    fallback_from_step: int | None = None  # the newest checkpoint, unusable, that the resume skipped
    fallback_lost_steps: int = 0  # the steps that fallback cost beyond the newest checkpoint
    class_evidence: str = ""  # the fact that decided the class (the failed attempt's)
    # Restarts between the failure and this attempt that failed before their first step: the
    # recovery spans them (their time is in its resubmit phase).
    failed_restarts: int = 0
    # restart.strategy warm: the slot of the spare that took the dead rank's place, and where the
    # state came from ("peer": a survivor's, no rollback; "checkpoint": none survived).
    spare: str | None = None
    state_source: str | None = None
    # JSON: each phase's (and ttr_s's) uncertainty from the clocks its two moments were stamped on
    # (0: one clock; null: a clock not read), and the offsets applied (node -> [offset, uncertainty]).
    phase_uncertainty: str = "{}"
    clock_offsets: str = "{}"


Row = TypeVar("Row")


class LedgerBusy(RuntimeError):
    """The ledger's journal must change and another connection holds the database open."""


def journal_mode(path: Path, mountinfo: str | None = None) -> str:
    """WAL on a filesystem known to be local; DELETE (a rollback journal, which takes the
    filesystem's locks) anywhere else: SQLite's WAL needs every process that opens the database on
    one host. ``path`` itself is resolved (a ledger file linked onto NFS is on NFS)."""
    return "DELETE" if on_network_filesystem(path, mountinfo) else "WAL"


def set_journal_mode(db: sqlite3.Connection, wanted: str, path: Path) -> None:
    """The journal ``wanted``, switched only where the database has another: a switch needs the
    database to itself (no other connection open), so it is retried until JOURNAL_SWITCH_S, then
    refused with what to do."""
    if _journal_mode(db) == wanted:
        return
    deadline = time.monotonic() + JOURNAL_SWITCH_S
    while True:
        try:
            if str(db.execute(f"PRAGMA journal_mode={wanted}").fetchone()[0]).upper() == wanted:
                return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
        if time.monotonic() >= deadline:
            raise LedgerBusy(f"{path}: its journal must change from {_journal_mode(db)} to {wanted} (its filesystem "
                             f"says which), and another process holds it open: close the other faultdrill processes "
                             f"on this workdir (a drill, status, report), then run again")
        time.sleep(JOURNAL_RETRY_S)


def _journal_mode(db: sqlite3.Connection) -> str:
    return str(db.execute("PRAGMA journal_mode").fetchone()[0]).upper()


class Ledger:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        try:
            self._db.row_factory = sqlite3.Row
            set_journal_mode(self._db, journal_mode(path), path)
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            self._add_missing_columns()
        except BaseException:
            self._db.close()
            raise
        self._depth = 0
        # What this connection wrote, per run: a reader that shows a run (the live story) reads it
        # again only when its count moved (issue 29); ``_epoch`` moves for a write of no known run.
        self._writes: dict[str, int] = {}
        self._epoch = 0
        self._fault_runs: dict[int, str] = {}  # fault id -> its run, for a fault's update
        self._data_version: int | None = None

    def _add_missing_columns(self) -> None:
        for table, columns in ADDED_COLUMNS.items():
            present = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for column, declaration in columns.items():
                if column not in present:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Every write inside happens, or none does (a controller stopped halfway leaves no half)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            self._depth = 0

    @classmethod
    def in_workdir(cls, workdir: Path) -> "Ledger":
        """The workdir's ledger, where it lives (orchestrator/record/ledger_home.py)."""
        return cls(ledger_path(workdir))

    def close(self) -> None:
        self._db.close()

    def writes(self, run_id: str) -> tuple[int, int]:
        """A count that moves whenever this connection wrote a row of ``run_id`` (or a row whose run
        it does not know, or another connection committed since ``others_committed`` was last
        asked): equal counts, the run's rows unchanged."""
        return self._epoch, self._writes.get(run_id, 0)

    def others_committed(self) -> bool:
        """Another connection (a ``faultdrill`` command beside the controller) committed since the
        last call: every run's count moves."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        changed = self._data_version is not None and version != self._data_version
        self._data_version = version
        if changed:
            self._epoch += 1
        return changed

    def _wrote(self, run_id: str | None) -> None:
        if run_id is None:
            self._epoch += 1
        else:
            self._writes[run_id] = self._writes.get(run_id, 0) + 1

    # meta -------------------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def meta(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    # runs -------------------------------------------------------------------------------------
    def add_run(self, run: RunRow) -> None:
        self._insert("runs", _columns(run), ignore=True)

    def update_run(self, run_id: str, **values: Any) -> None:
        self._update("runs", values, "run_id = ?", (run_id,))

    def mark_running(self, run_id: str, at: float) -> None:
        """The run is running, started at ``at`` unless it started before (one statement: a sweep
        marks thousands)."""
        self._wrote(run_id)
        self._db.execute("UPDATE runs SET status = 'running', started = COALESCE(started, ?) WHERE run_id = ?",
                         (at, run_id))

    def runs(self) -> list[RunRow]:
        return self._select(RunRow, "SELECT * FROM runs ORDER BY run_id")

    def run(self, run_id: str) -> RunRow:
        rows = self._select(RunRow, "SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        return rows[0]

    # attempts ---------------------------------------------------------------------------------
    def add_attempt(self, run_id: str, attempt: int, job_name: str | None = None,
                    array_index: int | None = None, excluded_nodes: tuple[str, ...] = ()) -> None:
        row = AttemptRow(run_id=run_id, attempt=attempt, job_id=None, state="SUBMITTING", submitted=time.time(),
                         job_name=job_name, array_index=array_index, excluded_nodes=",".join(excluded_nodes) or None)
        self._insert("attempts", _columns(row))

    def update_attempt(self, run_id: str, attempt: int, **values: Any) -> None:
        self._update("attempts", values, "run_id = ? AND attempt = ?", (run_id, attempt))

    def attempts(self, run_id: str) -> list[AttemptRow]:
        return self._select(AttemptRow, "SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,))

    # faults -----------------------------------------------------------------------------------
    def add_fault(self, fault: FaultRow) -> int:
        values = {k: v for k, v in _columns(fault).items() if k != "fault_id"}
        cursor = self._insert("faults", values)
        fault_id = int(cursor.lastrowid or 0)
        self._fault_runs[fault_id] = fault.run_id
        return fault_id

    def update_fault(self, fault_id: int, **values: Any) -> None:
        self._update("faults", values, "fault_id = ?", (fault_id,))

    def faults(self, run_id: str) -> list[FaultRow]:
        rows = self._select(FaultRow, "SELECT * FROM faults WHERE run_id = ? ORDER BY plan_index", (run_id,))
        self._fault_runs.update((row.fault_id, row.run_id) for row in rows if row.fault_id is not None)
        return rows

    # checkpoints ------------------------------------------------------------------------------
    def add_checkpoints(self, run_id: str, records: list[CheckpointRecord]) -> None:
        for record in records:
            values = asdict(record)
            values["files"] = json.dumps(values["files"], sort_keys=True)
            self._insert("checkpoints", {"run_id": run_id, **values}, ignore=True)

    def checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        rows = self._db.execute("SELECT * FROM checkpoints WHERE run_id = ? ORDER BY step, attempt", (run_id,))
        names = {f.name for f in fields(CheckpointRecord)}
        return [
            CheckpointRecord(**{k: (json.loads(row[k]) if k == "files" else row[k]) for k in row.keys() if k in names})
            for row in rows
        ]

    # recoveries -------------------------------------------------------------------------------
    def update_recovery(self, run_id: str, attempt: int, **values: Any) -> None:
        self._update("recoveries", values, "run_id = ? AND attempt = ?", (run_id, attempt))

    def add_recovery(self, recovery: RecoveryRow) -> None:
        self._insert("recoveries", _columns(recovery), ignore=True)

    def recoveries(self, run_id: str) -> list[RecoveryRow]:
        return self._select(RecoveryRow, "SELECT * FROM recoveries WHERE run_id = ? ORDER BY attempt", (run_id,))

    # helpers ----------------------------------------------------------------------------------
    def _insert(self, table: str, values: dict[str, Any], ignore: bool = False) -> sqlite3.Cursor:
        verb = "INSERT OR IGNORE" if ignore else "INSERT"
        self._wrote(values.get("run_id"))
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        return self._db.execute(f"{verb} INTO {table} ({columns}) VALUES ({marks})", tuple(values.values()))

    def _update(self, table: str, values: dict[str, Any], where: str, args: tuple[Any, ...]) -> None:
        if not values:
            return
        self._wrote(self._fault_runs.get(args[0]) if table == "faults" else str(args[0]))
        assignments = ", ".join(f"{column} = ?" for column in values)
        self._db.execute(f"UPDATE {table} SET {assignments} WHERE {where}", (*values.values(), *args))

    def _select(self, row_type: type[Row], query: str, args: tuple[Any, ...] = ()) -> list[Row]:
        return [row_type(**dict(row)) for row in self._db.execute(query, args)]


def _columns(row: Any) -> dict[str, Any]:
    """A row's columns by name (its fields hold plain values: no deep copy as asdict makes)."""
    names = _FIELD_NAMES.get(type(row))
    if names is None:
        names = _FIELD_NAMES[type(row)] = tuple(f.name for f in fields(row))
    return {name: getattr(row, name) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # each row type's, looked up once
