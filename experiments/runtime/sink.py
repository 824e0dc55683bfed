"""Durable file writes for one rank's share of a checkpoint: temporary name, fsync, rename.

A rank killed mid-write leaves only a hidden temporary file, never a truncated file under the
final name; the store ignores hidden names when it hashes the checkpoint. Each file is hashed while
its fsync runs (its bytes are still in the page cache; BLAKE3 where it is installed, else sha256:
experiments.runtime.integrity), so the manifest's hashes cost no time of their own on a disk slower
than the hash. When a rank closes its sink it leaves a receipt (a hidden JSON file: the size and
hash of every file it wrote, and the algorithm), so that rank 0 publishes exactly what every rank
delivered, without reading it back, and notices a rank that delivered nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, cast

from experiments.layout import MANIFEST_NAME
from experiments.runtime.integrity import LEGACY_ALGORITHM, default_algorithm, digest_fresh_file
from experiments.runtime.writeback import start_writeback

_COPY_CHUNK = 4 << 20


class FileSink:
    """Hands out files inside one (partial) checkpoint directory; the workload writes through it."""

    def __init__(self, directory: Path, rank: int = 0, committer: bool = False) -> None:
        self.directory = directory
        self.rank = rank
        self.written: dict[str, int] = {}  # name -> bytes: this rank's share, listed in its receipt
        self.algorithm = default_algorithm()
        self.hashes: dict[str, str] = {}  # name -> its hash (self.algorithm), taken while the file was made durable
        # The committing rank's files: their fsyncs run on, and the commit waits for them together with
        # the manifest's and the directory's (one round of the disk's flushes, not one a file).
        self._syncs: _Syncs | None = _Syncs() if committer else None

    @contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        """A binary file that appears under ``name`` only once it is complete and on disk."""
        _check_name(name)
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        handle = open(tmp, "wb")
        try:
            yield cast(BinaryIO, WritebackFile(handle))
            handle.flush()
            digest = self._durable_hash(tmp, handle.fileno())
        except BaseException:
            handle.close()
            tmp.unlink(missing_ok=True)
            raise
        handle.close()
        os.replace(tmp, final)
        self._record(name, final, digest)

    def _durable_hash(self, path: Path, fd: int) -> str:
        """The file's hash, read back while its fsync runs; the fsync waited for here, or by the
        commit (committer)."""
        if self._syncs is None:
            return durable_hash(path, fd, self.algorithm)
        self._syncs.start(fd)
        return digest_fresh_file(path, self.algorithm)

    def wait_durable(self) -> None:
        """Every file this sink wrote is on disk (a committer's fsyncs run on after its writes)."""
        if self._syncs is not None:
            self._syncs.wait()

    def abandon(self) -> None:
        """A committer's share that will not be published: its fsyncs ended, their errors dropped."""
        if self._syncs is not None:
            self._syncs.wait(raise_errors=False)

    def _record(self, name: str, final: Path, digest: str) -> None:
        self.written[name] = final.stat().st_size
        self.hashes[name] = digest

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.open(name) as handle:
            handle.write(data)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A hidden directory inside this one (same file system, so ``adopt`` renames), where a
        framework may write files by path; removed with whatever was not adopted."""
        path = self.new_scratch()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def new_scratch(self) -> Path:
        """``scratch`` for a caller that removes it itself (a write that ends on another thread);
        a partial directory left behind goes with its scratch (CheckpointStore.remove_stale)."""
        path = self.directory / f".scratch-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path

    def adopt(self, path: Path, name: str) -> None:
        """Publish a file a framework wrote itself (at ``path``) under ``name``: fsync, rename.

        Frameworks that write by path (``tf.train.Checkpoint.write``) do not fsync; ``path``
        should lie on this directory's file system (e.g. a hidden scratch directory inside it) so
        that the rename is atomic. From another file system it is copied through ``open``.
        """
        _check_name(name)
        if _shared(path):  # a link to a file that is not the checkpoint's alone: its bytes are copied
            self._copy_in(path, name)
            return
        with open(path, "rb") as handle:
            digest = self._durable_hash(path, handle.fileno())
        final = self.directory / name
        try:
            os.replace(path, final)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            self._copy_in(path, name)
            return
        self._record(name, final, digest)

    def _copy_in(self, path: Path, name: str) -> None:
        """``path``'s bytes as a regular file of the checkpoint's own; ``path`` itself (a link, or
        a file on another file system) removed, whatever it pointed to left as it was."""
        with open(path, "rb") as source, self.open(name) as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK)
        os.unlink(path)

    def close(self) -> None:
        """Leave this rank's receipt (before the ranks meet). It is coordination, not data: written
        by rename, not fsynced; rank 0's manifest, written and fsynced with its directory after every
        rank's receipt, is what makes the checkpoint's names durable."""
        receipt = self.directory / receipt_name(self.rank)
        tmp = receipt.with_name(f".{receipt.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"rank": self.rank, "files": self.written, "hash_algorithm": self.algorithm,
                                  "hashes": self.hashes}))
        os.replace(tmp, receipt)


class WritebackFile:
    """The file a rank's share is written into, which tells the disk to start writing every
    ``WRITEBACK_BYTES`` as they go out (experiments.runtime.writeback): the disk writes while the
    framework serializes the rest, and the fsync at the end finds little left. A hint only; any
    other use of the file goes to the file itself."""

    WRITEBACK_BYTES = 2 << 20

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._written = 0
        self._started_to = 0  # bytes whose writeback has been started

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.WRITEBACK_BYTES):
            self._written += self._handle.write(view[start:start + self.WRITEBACK_BYTES])
            if self._written - self._started_to >= self.WRITEBACK_BYTES:
                self._handle.flush()
                start_writeback(self._handle.fileno(), self._started_to, self._written - self._started_to)
                self._started_to = self._written
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class _Syncs:
    """fsyncs started now and waited for later, each on a duplicate of the file's descriptor (the
    writer closes its own at once); the first error is raised by ``wait``. At most MAX_PENDING are
    pending (each holds a descriptor): one more waits for the oldest."""

    MAX_PENDING = 32

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def start(self, fd: int) -> None:
        if len(self._pending) >= self.MAX_PENDING:
            self._pending.pop(0).result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fsync")
        duplicate = os.dup(fd)
        try:
            self._pending.append(self._pool.submit(_fsync_and_close, duplicate))
        except BaseException:
            os.close(duplicate)
            raise

    def wait(self, raise_errors: bool = True) -> None:
        pending, self._pending = self._pending, []
        try:
            for synced in pending:
                error = synced.exception()
                if error is not None and raise_errors:
                    raise error
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_hash(path: Path, fd: int, algorithm: str) -> str:
    """fsync ``fd`` (the file at ``path``) and, meanwhile, hash the file: both release the GIL, and
    the bytes just written are read back from the page cache, so this takes about the fsync's time."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync") as pool:
        synced = pool.submit(os.fsync, fd)
        digest = digest_fresh_file(path, algorithm)
        synced.result()
    return digest


@dataclass(frozen=True)
class Receipt:
    """What one rank delivered into a checkpoint: name -> size, and name -> hash under ``algorithm``
    (files an older writer listed without a hash are hashed when the manifest is written)."""
    sizes: dict[str, int]
    hashes: dict[str, str] = field(default_factory=dict)
    algorithm: str = LEGACY_ALGORITHM


def receipt_name(rank: int) -> str:
    return f".receipt-rank{rank:05d}.json"


def read_receipt(path: Path) -> Receipt | None:
    """The files a rank's receipt lists; None if it left none."""
    try:
        with open(path) as handle:
            receipt = json.load(handle)
    except FileNotFoundError:
        return None
    files = receipt.get("files") if isinstance(receipt, dict) else None
    # an older writer's receipt: its hashes under "sha256"
    hashes = receipt.get("hashes", receipt.get(LEGACY_ALGORITHM, {})) if isinstance(receipt, dict) else None
    algorithm = receipt.get("hash_algorithm", LEGACY_ALGORITHM) if isinstance(receipt, dict) else None
    if not isinstance(files, dict) or not isinstance(hashes, dict) or not isinstance(algorithm, str):
        raise ValueError(f"{path}: not a checkpoint receipt")
    return Receipt({str(name): int(size) for name, size in files.items()},
                   {str(name): str(digest) for name, digest in hashes.items() if name in files}, algorithm)


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or name == MANIFEST_NAME:
        raise ValueError(f"checkpoint file name {name!r} is reserved or not a plain name")


def _shared(path: Path) -> bool:
    """A symlink, or a file with another hard link: renamed into a checkpoint, it would publish a
    file that lies (or also lies) outside it, which a corrupt-checkpoint fault would then damage."""
    info = os.lstat(path)
    return stat.S_ISLNK(info.st_mode) or info.st_nlink > 1
