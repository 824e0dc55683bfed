"""The checkpoint store: ``<run>/checkpoints/step-%08d/`` directories, each with a manifest.

A checkpoint becomes visible in one atomic step: every file is written under a hidden partial
directory (temporary name, fsync, rename), each rank leaves a receipt naming its files, rank 0
checks that every rank delivered, hashes the files, writes ``manifest.json`` and renames the
partial directory to its final name. A crash at any moment therefore leaves either a complete
checkpoint or a hidden partial directory that the next attempt removes. Readers still verify sizes
and hashes ("newest valid"), because storage can lose or tear data after the fact, and skip a
checkpoint a rank failed to load. What cannot be used is moved aside to
``<run>/checkpoints/quarantine`` (on the checkpoints' filesystem: one rename), never deleted: a
read error may be the storage's, not the checkpoint's.

No framework is imported here, so the login node can ask for the newest valid checkpoint too.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from experiments.layout import (
    CHECKPOINT_PREFIX,
    MANIFEST_NAME,
    CheckpointRecord,
    RunPaths,
    append_json_line,
    fsync_dir,
    read_json_lines,
    record_dict,
)
from experiments.runtime.integrity import default_algorithm
from experiments.runtime.sink import FileSink, read_receipt, receipt_name
from experiments.runtime.verify import (
    UNCHECKABLE,
    Problem,
    check_checkpoint,
    file_hash,
    read_manifest,
    verify_checkpoint,
)

log = logging.getLogger(__name__)

# 2: the files are those every rank's receipt listed, "ranks" says how many; 3: "hash_algorithm"
# names the files' hash (experiments.runtime.integrity; none named: sha256)
MANIFEST_VERSION = 3
_STEP_DIR = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)$")
_HIDDEN = "." + CHECKPOINT_PREFIX  # partial and trash directories: never candidates for a resume
_TRASH = ".trash-"  # in the name of a directory being deleted
REJECTED = "rejected"  # a ScanEntry's problem_kind: verified, but a rank failed to load it

__all__ = ["CheckpointIncomplete", "CheckpointMeta", "CheckpointUncheckable", "CheckpointStore", "ScanEntry", "ValidCheckpoint",
           "file_hash", "step_dir_name", "verify_checkpoint"]


class CheckpointIncomplete(RuntimeError):
    """A rank did not deliver its share of a checkpoint: it is not published."""


class CheckpointUncheckable(RuntimeError):
    """The newest checkpoint was hashed with an algorithm this Python cannot compute: the rank
    stops there (a cold start or an older checkpoint would lose the run's progress for good)."""


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
    problem_kind: str | None = None  # verify.INVALID, verify.UNREADABLE, verify.UNCHECKABLE or "rejected"


def step_dir_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


class CheckpointStore:
    """Checkpoints of one run. Rank 0 commits and prunes; every rank writes through ``sink``."""

    def __init__(self, run_dir: Path | str, keep: int = 0) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.root = self.paths.checkpoints
        self.keep = keep  # <= 0 keeps every checkpoint
        self._committers: dict[int, list[FileSink]] = {}  # step -> rank 0's sinks, their fsyncs still running
        self._reaper: ThreadPoolExecutor | None = None  # deletes pruned checkpoints off the saving thread
        self._reaping: Future[None] | None = None  # its deletion in progress

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def partial_dir(self, step: int) -> Path:
        return self.root / f".{step_dir_name(step)}.partial"

    def sink(self, step: int, rank: int = 0) -> FileSink:
        """Where ``rank`` writes its files for checkpoint ``step`` (all ranks share the directory).
        Rank 0's (the committer's) files are flushed while it goes on; ``commit`` waits for them
        with the manifest's and the directory's flushes."""
        directory = self.partial_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        if rank != 0:
            return FileSink(directory, rank)
        for older in [found for found in self._committers if found < step]:  # never committed: a failed save
            for abandoned in self._committers.pop(older):
                abandoned.abandon()
        sink = FileSink(directory, rank, committer=True)
        self._committers.setdefault(step, []).append(sink)
        return sink

    def remove_stale(self) -> list[Path]:
        """Remove the partial and half-pruned directories an attempt that died left (rank 0, at
        start): each renamed out of the way at once (a partial one's name is free for this attempt),
        its bytes deleted in the background (a resume does not wait for them)."""
        if not self.root.is_dir():
            return []
        stale = sorted(p for p in self.root.iterdir() if p.name.startswith(_HIDDEN))
        doomed = []
        for path in stale:
            log.warning("removing stale checkpoint directory %s", path)
            try:
                doomed.append(path if _TRASH in path.name else self._renamed_to_trash(path))
            except FileNotFoundError:  # gone meanwhile (published or removed by another attempt)
                continue
        if doomed:
            self._reap(doomed)
        return stale

    def commit(
        self, step: int, attempt: int, meta: CheckpointMeta, started: float, blocking_s: float | None,
        ranks: int = 1, before_publish: Callable[[], None] | None = None,
    ) -> CheckpointRecord:
        """Hash, write the manifest, publish, log and prune: rank 0, after every rank wrote its files.

        The manifest lists the files the ``ranks`` receipts name (each rank's sink leaves one when
        it closes): a rank that delivered nothing, or a file that is gone, raises
        CheckpointIncomplete and nothing is published. ``started`` is the ``time.monotonic()`` at
        which training stopped for this checkpoint; ``persist_s`` runs from there to the publish
        (the manifest's own copy stops where its hashes were known: it cannot time its own write).
        ``blocking_s`` None: training waits for this commit (synchronous), so it equals persist_s.
        The files, the manifest and the directory are flushed together, once, before the rename
        that publishes (a crash before it leaves a hidden partial directory). ``before_publish`` runs right
        before anything is read, before the manifest is written and right before the rename that
        publishes (the attempt fence: it raises to stop a stale attempt, which then touches nothing).
        """
        own_shares = self._committers.pop(step, [])  # rank 0's sinks of this step: their flushes end here
        try:
            return self._commit(step, attempt, meta, started, blocking_s, ranks, before_publish, own_shares)
        except BaseException:
            for sink in own_shares:  # a failed commit's flushes are not a later checkpoint's concern
                sink.abandon()
            raise

    def _commit(
        self, step: int, attempt: int, meta: CheckpointMeta, started: float, blocking_s: float | None,
        ranks: int, before_publish: Callable[[], None] | None, own_shares: list[FileSink],
    ) -> CheckpointRecord:
        partial = self.partial_dir(step)
        if before_publish is not None:  # a stale attempt touches nothing (another may be writing this step)
            before_publish()
        algorithm = default_algorithm()
        sizes, delivered_hashes = self._delivered(partial, step, ranks, algorithm)
        hashes = {name: delivered_hashes.get(name) or file_hash(partial / name, algorithm) for name in sorted(sizes)}
        persist_s = time.monotonic() - started
        final = self.step_dir(step)
        record = CheckpointRecord(
            step=step, attempt=attempt, path=str(final), time=time.time(), bytes=sum(sizes.values()),
            files=hashes, framework=meta.framework, format=meta.format, writers=meta.writers,
            blocking_s=persist_s if blocking_s is None else blocking_s, persist_s=persist_s, hash_algorithm=algorithm,
        )
        manifest = {**record_dict(record), "sizes": sizes, "ranks": ranks, "version": MANIFEST_VERSION}
        del manifest["path"]  # the directory may be moved as a whole; its name gives the step
        if before_publish is not None:  # again: the hashes took time, and the manifest replaces the receipts
            before_publish()
        try:  # rank 0's own files' flushes end here: a full disk may say so only now (delayed allocation)
            self._write_manifest_durably(partial, manifest, ranks, own_shares)
        except OSError as error:
            raise explain_write_failure(error, self.root, step) from error
        if before_publish is not None:
            before_publish()
        if final.exists():
            # Only a checkpoint that could not be used can sit here: a resume starts from the newest valid.
            self.quarantine(final, "replaced by a new checkpoint of the same step")
        os.rename(partial, final)
        fsync_dir(self.root)
        published_s = time.monotonic() - started
        record = replace(record, persist_s=published_s, blocking_s=published_s if blocking_s is None else blocking_s)
        append_json_line(self.paths.checkpoint_log, record_dict(record))
        self.prune()
        return record

    @staticmethod
    def _write_manifest_durably(partial: Path, manifest: dict[str, Any], ranks: int, own_shares: list[FileSink]) -> None:
        """The manifest under its name, then its flush, the partial directory's (every file's name in
        it) and rank 0's files' (started when each was written) at once: one round of the disk's
        flushes. The ranks' receipts go first (the manifest says what they said)."""
        tmp = partial / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
        with open(tmp, "w") as handle:
            json.dump(manifest, handle, sort_keys=True)
            handle.flush()
            os.replace(tmp, partial / MANIFEST_NAME)
            for rank in range(ranks):
                (partial / receipt_name(rank)).unlink(missing_ok=True)
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsync") as pool:
                flushes = [pool.submit(os.fsync, handle.fileno()), pool.submit(fsync_dir, partial)]
                for sink in own_shares:
                    sink.wait_durable()
                for flush in flushes:
                    flush.result()

    def await_receipts(self, step: int, ranks: int, timeout_s: float) -> None:
        """Wait until every rank left its receipt for checkpoint ``step`` (ranks persisting in the
        background meet here, not in a barrier on the training path); CheckpointIncomplete by the deadline."""
        partial = self.partial_dir(step)
        deadline = time.monotonic() + timeout_s
        pause = 0.002
        while missing := [rank for rank in range(ranks) if not (partial / receipt_name(rank)).exists()]:
            if time.monotonic() > deadline:
                raise CheckpointIncomplete(f"checkpoint {step}: rank(s) {missing} of {ranks} delivered no receipt "
                                           f"within {timeout_s:g} s: not published")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _delivered(self, partial: Path, step: int, ranks: int, algorithm: str) -> tuple[dict[str, int], dict[str, str]]:
        """File name -> size (each checked on disk) and name -> hash under ``algorithm`` of every
        file the ranks' receipts list (a rank that hashed with another algorithm: none, its files
        are hashed again)."""
        sizes: dict[str, int] = {}
        hashes: dict[str, str] = {}
        for rank in range(ranks):
            receipt = read_receipt(partial / receipt_name(rank))
            if receipt is None:
                raise CheckpointIncomplete(f"checkpoint {step}: rank {rank} of {ranks} delivered no receipt "
                                           f"({partial / receipt_name(rank)} missing): not published")
            sizes.update(receipt.sizes)
            if receipt.algorithm == algorithm:
                hashes.update(receipt.hashes)
        if not sizes:
            raise CheckpointIncomplete(f"checkpoint {step}: no rank wrote a file into it ({ranks} receipts, all "
                                       "empty): nothing to resume from, not published")
        for name, size in sorted(sizes.items()):
            try:
                actual = (partial / name).stat().st_size
            except FileNotFoundError:
                raise CheckpointIncomplete(f"checkpoint {step}: {name} is listed by a receipt but missing") from None
            if actual != size:
                raise CheckpointIncomplete(f"checkpoint {step}: {name} is {actual} bytes, its receipt says {size}")
        strays = sorted(p.name for p in partial.iterdir() if p.is_file() and _is_payload(p.name) and p.name not in sizes)
        if strays:
            log.warning("checkpoint %d: files no rank listed are left out of the manifest: %s", step, strays)
        return sizes, hashes

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
        """Move aside the directories newer than the resume point (rank 0): they could not be used
        (invalid, unreadable, rejected). Never deleted: an unreadable one may be fine tomorrow."""
        return [moved for _, moved in self.set_aside_newer_than(step)]

    def set_aside_newer_than(self, step: int) -> list[tuple[int, Path]]:
        """``discard_newer_than``, with the step of each directory moved aside."""
        return [(found, self.quarantine(path, f"newer than the resume step {step} but not usable"))
                for found, path in self._final_dirs() if found > step]

    def quarantine(self, path: Path, reason: str) -> Path:
        """Take a checkpoint directory out of the choice, keeping its bytes; log where it went."""
        self.paths.quarantine.mkdir(parents=True, exist_ok=True)
        target = self.paths.quarantine / f"{path.name}.{time.time_ns()}"
        os.rename(path, target)
        log.warning("moved checkpoint %s aside to %s: %s", path, target, reason)
        append_json_line(self.paths.quarantine / "index.jsonl",
                         {"from": str(path), "to": str(target), "reason": reason, "time": time.time()})
        return target

    def reject(self, step: int, rank: int, attempt: int, error: str) -> None:
        """A rank failed to load checkpoint ``step``: keep it out of the next attempt's choice."""
        try:
            written = read_manifest(self.step_dir(step)).get("time")
        except (OSError, ValueError):
            written = None
        append_json_line(self.paths.checkpoint_rejections, {
            "step": step, "manifest_time": written, "rejected_at": time.time(), "rank": rank,
            "attempt": attempt, "error": error[:2000],
        })

    def scan(self, verify_hashes: bool = True) -> list[ScanEntry]:
        """Every final directory, newest first, with the reason it is unusable (or None)."""
        rejections = read_json_lines(self.paths.checkpoint_rejections)
        entries = []
        for step, path in self._final_dirs():
            manifest, problem = check_checkpoint(path, step, verify_hashes)
            if problem is None and manifest is not None:
                problem = _rejection(rejections, step, manifest)
            entries.append(ScanEntry(step, path, problem.text if problem else None, problem.kind if problem else None))
        return entries

    def newest_valid(self, verify_hashes: bool = True) -> ValidCheckpoint | None:
        """The newest checkpoint whose manifest, sizes and hashes check out and that no rank failed
        to load; logs each one it skips."""
        rejections = read_json_lines(self.paths.checkpoint_rejections)
        for step, path in self._final_dirs():
            manifest, problem = check_checkpoint(path, step, verify_hashes)
            if problem is not None and problem.kind == UNCHECKABLE:  # neither fall back past it nor set it aside
                raise CheckpointUncheckable(f"checkpoint {path}: {problem}; the run's progress is kept: no older "
                                            "checkpoint is taken, nothing is moved aside")
            if problem is None and manifest is not None:
                problem = _rejection(rejections, step, manifest)
            if problem is None and manifest is not None:
                return ValidCheckpoint(step, path, manifest)
            log.warning("skipping checkpoint %s (%s): %s", path, problem.kind if problem else "?", problem)
        return None

    def agreed(self, step: int) -> ValidCheckpoint:
        """Checkpoint ``step`` as rank 0 verified it (the other ranks read its manifest, not its hashes)."""
        path = self.step_dir(step)
        return ValidCheckpoint(step, path, read_manifest(path))

    def published(self) -> list[tuple[int, Path]]:
        """Every published (final) checkpoint directory, newest first, valid or not."""
        return self._final_dirs()

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
        """Out of every reader's sight at once (one rename to a hidden name); its bytes deleted on a
        thread of its own, so that a save does not wait for the old one's deletion (one left
        half-deleted by an exit is removed with the other hidden directories: remove_stale)."""
        self._reap([self._renamed_to_trash(path)])

    def _renamed_to_trash(self, path: Path) -> Path:
        trash = self.root / f".{path.name.lstrip('.')}{_TRASH}{os.getpid()}-{time.monotonic_ns()}"
        os.rename(path, trash)
        return trash

    def _reap(self, paths: list[Path]) -> None:
        """Delete ``paths`` in the background, one batch at a time: a deletion slower than the
        checkpoints waits for the one before it (never a pile of old checkpoints on the disk)."""
        if self._reaping is not None:
            self._reaping.result()
        if self._reaper is None:
            self._reaper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prune")
        self._reaping = self._reaper.submit(_delete_all, paths)

    def wait_pruned(self) -> None:
        """Every pruned checkpoint's bytes deleted."""
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
            self._reaper, self._reaping = None, None


def _delete_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _is_payload(name: str) -> bool:
    return not name.startswith(".") and name != MANIFEST_NAME


def _rejection(rejections: list[dict[str, Any]], step: int, manifest: dict[str, Any]) -> Problem | None:
    """Why this very checkpoint (its step and the time its manifest was written) was rejected, if
    it was; a checkpoint of the same step written later by another attempt is not rejected."""
    for rejection in rejections:
        if rejection.get("step") != step:
            continue
        written = rejection.get("manifest_time")
        if written == manifest.get("time") or (written is None and manifest.get("time", 0) < rejection["rejected_at"]):
            return Problem(REJECTED, f"rank {rejection.get('rank')} of attempt {rejection.get('attempt')} failed to "
                                     f"load it: {rejection.get('error')}")
    return None


FULL_BELOW_BYTES = 8 << 20  # less free than this after a failed write: the filesystem is why


def explain_write_failure(error: Exception, directory: Path, step: int) -> Exception:
    """A failed checkpoint write, named by its cause. The errno says it when an OSError in the
    error's chain carries one (ENOSPC, EDQUOT); frameworks that hide it inside their own errors
    (torch: "unexpected pos ...") leave only the filesystem's free space to say it."""
    free = _free_bytes(directory)
    found = next((link.errno for link in _chain(error)
                  if isinstance(link, OSError) and link.errno in OUT_OF_SPACE_ERRNOS), None)
    if found is None and (free is None or free >= FULL_BELOW_BYTES):
        return error
    code = found or errno.ENOSPC
    where = f"{free / (1 << 20):.1f} MB free on {directory}" if free is not None else str(directory)
    return OSError(code, f"checkpoint step {step} could not be written: {OUT_OF_SPACE_ERRNOS[code]} "
                         f"({where}); {type(error).__name__}: {error}")


OUT_OF_SPACE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def _chain(error: BaseException) -> list[BaseException]:
    """The error and its causes and contexts, each once."""
    links: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in links:
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


def _free_bytes(directory: Path) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize
