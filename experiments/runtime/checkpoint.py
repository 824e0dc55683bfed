"""The checkpoint store: ``<run>/checkpoints/step-%08d/`` directories, each with a manifest.

A checkpoint becomes visible in one atomic step: every file is written under a hidden partial
directory (temporary name, fsync, rename), rank 0 hashes them, writes ``manifest.json`` and renames
the partial directory to its final name. A crash at any moment therefore leaves either a complete
checkpoint or a hidden partial directory that the next attempt removes. Readers still verify sizes
and sha256 ("newest valid"), because storage can lose or tear data after the fact.

No framework is imported here, so the login node can ask for the newest valid checkpoint too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.layout import (
    CHECKPOINT_PREFIX,
    MANIFEST_NAME,
    CheckpointRecord,
    RunPaths,
    append_json_line,
    fsync_dir,
    record_dict,
    write_json_atomic,
)
from experiments.runtime.sink import FileSink

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
_STEP_DIR = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)$")
_HIDDEN = "." + CHECKPOINT_PREFIX  # partial and trash directories: never candidates for a resume
_HASH_CHUNK = 4 << 20


@dataclass(frozen=True)
class CheckpointMeta:
    """What the workload says about its checkpoints (the same for every checkpoint of a run)."""

    framework: str
    format: str
    writers: str  # "rank0" or "all"


@dataclass(frozen=True)
class ValidCheckpoint:
    step: int
    path: Path
    manifest: dict[str, Any]


@dataclass(frozen=True)
class ScanEntry:
    """One final checkpoint directory and why it cannot be used (``problem`` None: it can)."""

    step: int
    path: Path
    problem: str | None


def step_dir_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointStore:
    """Checkpoints of one run. Rank 0 commits and prunes; every rank writes through ``sink``."""

    def __init__(self, run_dir: Path | str, keep: int = 0) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.root = self.paths.checkpoints
        self.keep = keep  # <= 0 keeps every checkpoint

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def partial_dir(self, step: int) -> Path:
        return self.root / f".{step_dir_name(step)}.partial"

    def sink(self, step: int) -> FileSink:
        """Where this rank writes its files for checkpoint ``step`` (all ranks share the directory)."""
        directory = self.partial_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        return FileSink(directory)

    def remove_stale(self) -> list[Path]:
        """Delete partial and half-pruned directories left by an attempt that died (rank 0, at start)."""
        if not self.root.is_dir():
            return []
        stale = sorted(p for p in self.root.iterdir() if p.name.startswith(_HIDDEN))
        for path in stale:
            log.warning("removing stale checkpoint directory %s", path)
            shutil.rmtree(path, ignore_errors=True)
        return stale

    def commit(
        self, step: int, attempt: int, meta: CheckpointMeta, started: float, blocking_s: float | None
    ) -> CheckpointRecord:
        """Hash, write the manifest, publish, log and prune: rank 0, after every rank wrote its files.

        ``started`` is the ``time.monotonic()`` at which training stopped for this checkpoint.
        ``persist_s`` runs from there to the manifest being durable; the rename that follows is a
        single metadata operation and is not included (the manifest cannot contain its own rename).
        ``blocking_s`` None: training waits for this commit (synchronous), so it equals persist_s.
        """
        partial = self.partial_dir(step)
        names = sorted(p.name for p in partial.iterdir() if p.is_file() and _is_payload(p.name))
        hashes = {name: sha256_file(partial / name) for name in names}
        sizes = {name: (partial / name).stat().st_size for name in names}
        persist_s = time.monotonic() - started
        final = self.step_dir(step)
        record = CheckpointRecord(
            step=step, attempt=attempt, path=str(final), time=time.time(), bytes=sum(sizes.values()),
            files=hashes, framework=meta.framework, format=meta.format, writers=meta.writers,
            blocking_s=persist_s if blocking_s is None else blocking_s, persist_s=persist_s,
        )
        manifest = {**record_dict(record), "sizes": sizes, "version": MANIFEST_VERSION}
        del manifest["path"]  # the directory may be moved as a whole; its name gives the step
        write_json_atomic(partial / MANIFEST_NAME, manifest)
        if final.exists():
            # Only an invalid checkpoint can sit here: a resume always starts from the newest valid.
            log.warning("replacing invalid checkpoint directory %s", final)
            self._trash(final)
        os.rename(partial, final)
        fsync_dir(self.root)
        append_json_line(self.paths.checkpoint_log, record_dict(record))
        self.prune()
        return record

    def prune(self) -> list[Path]:
        """Keep the newest ``keep`` final directories; rename first so no reader sees half a deletion."""
        if self.keep <= 0:
            return []
        entries = self._final_dirs()
        doomed = [path for _, path in entries[self.keep:]]
        for path in doomed:
            self._trash(path)
        return doomed

    def discard_newer_than(self, step: int) -> list[Path]:
        """Remove directories newer than the resume point: they failed verification (rank 0)."""
        doomed = [path for found, path in self._final_dirs() if found > step]
        for path in doomed:
            log.warning("discarding checkpoint %s newer than the resume step %d", path, step)
            self._trash(path)
        return doomed

    def scan(self, verify_hashes: bool = True) -> list[ScanEntry]:
        """Every final directory, newest first, with the reason it is unusable (or None)."""
        return [
            ScanEntry(step, path, verify_checkpoint(path, step, verify_hashes))
            for step, path in self._final_dirs()
        ]

    def newest_valid(self, verify_hashes: bool = True) -> ValidCheckpoint | None:
        """The newest checkpoint whose manifest, sizes and sha256 all check out; logs each skip."""
        for step, path in self._final_dirs():
            problem = verify_checkpoint(path, step, verify_hashes)
            if problem is None:
                return ValidCheckpoint(step, path, _read_manifest(path))
            log.warning("skipping checkpoint %s: %s", path, problem)
        return None

    def _final_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
        return sorted(found, reverse=True)

    def _trash(self, path: Path) -> None:
        trash = self.root / f".{path.name}.trash-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _is_payload(name: str) -> bool:
    return not name.startswith(".") and name != MANIFEST_NAME


def _read_manifest(path: Path) -> dict[str, Any]:
    with open(path / MANIFEST_NAME) as handle:
        manifest = json.load(handle)
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not a JSON object")
    return manifest


def verify_checkpoint(path: Path, step: int, verify_hashes: bool = True) -> str | None:
    """Why the checkpoint at ``path`` cannot be used, or None when it can."""
    try:
        manifest = _read_manifest(path)
    except FileNotFoundError:
        return "no manifest"
    except (ValueError, OSError) as error:
        return f"unreadable manifest ({error})"
    files, sizes = manifest.get("files"), manifest.get("sizes")
    if not isinstance(files, dict) or not isinstance(sizes, dict) or set(files) != set(sizes):
        return "manifest lacks matching 'files' and 'sizes' tables"
    if manifest.get("step") != step:
        return f"manifest step {manifest.get('step')!r} does not match the directory name"
    for name, expected_hash in sorted(files.items()):
        problem = _verify_file(path / name, sizes[name], expected_hash, verify_hashes)
        if problem:
            return f"{name}: {problem}"
    return None


def _verify_file(path: Path, size: Any, expected_hash: Any, verify_hashes: bool) -> str | None:
    try:
        actual_size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if actual_size != size:
        return f"size {actual_size} bytes, manifest says {size}"
    if verify_hashes and sha256_file(path) != expected_hash:
        return "sha256 mismatch"
    return None
