"""Durable file writes for one rank's share of a checkpoint: temporary name, fsync, rename.

A rank killed mid-write leaves only a hidden temporary file, never a truncated file under the
final name; the store ignores hidden names when it hashes the checkpoint. When a rank closes its
sink it leaves a receipt (a hidden JSON file: name -> size of every file it wrote), so that rank 0
publishes exactly what every rank delivered and notices a rank that delivered nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from experiments.layout import MANIFEST_NAME, fsync_dir, write_json_atomic

_COPY_CHUNK = 4 << 20


class FileSink:
    """Hands out files inside one (partial) checkpoint directory; the workload writes through it."""

    def __init__(self, directory: Path, rank: int = 0) -> None:
        self.directory = directory
        self.rank = rank
        self.written: dict[str, int] = {}  # name -> bytes: this rank's share, listed in its receipt

    @contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        """A binary file that appears under ``name`` only once it is complete and on disk."""
        _check_name(name)
        final = self.directory / name
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        handle = open(tmp, "wb")
        try:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            handle.close()
            tmp.unlink(missing_ok=True)
            raise
        handle.close()
        os.replace(tmp, final)
        self.written[name] = final.stat().st_size

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.open(name) as handle:
            handle.write(data)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A hidden directory inside this one (same file system, so ``adopt`` renames), where a
        framework may write files by path; removed with whatever was not adopted."""
        path = self.directory / f".scratch-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def adopt(self, path: Path, name: str) -> None:
        """Publish a file a framework wrote itself (at ``path``) under ``name``: fsync, rename.

        Frameworks that write by path (``tf.train.Checkpoint.write``) do not fsync; ``path``
        should lie on this directory's file system (e.g. a hidden scratch directory inside it) so
        that the rename is atomic. From another file system it is copied through ``open``.
        """
        _check_name(name)
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        final = self.directory / name
        try:
            os.replace(path, final)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            with open(path, "rb") as source, self.open(name) as target:
                shutil.copyfileobj(source, target, _COPY_CHUNK)
            os.unlink(path)
            return
        self.written[name] = final.stat().st_size

    def close(self) -> None:
        """Make this rank's renames durable, then leave its receipt (before the barrier)."""
        fsync_dir(self.directory)
        write_json_atomic(self.directory / receipt_name(self.rank), {"rank": self.rank, "files": self.written})


def receipt_name(rank: int) -> str:
    return f".receipt-rank{rank:05d}.json"


def read_receipt(path: Path) -> dict[str, int] | None:
    """The files (name -> size) a rank's receipt lists; None if it left none."""
    try:
        with open(path) as handle:
            receipt = json.load(handle)
    except FileNotFoundError:
        return None
    files = receipt.get("files") if isinstance(receipt, dict) else None
    if not isinstance(files, dict):
        raise ValueError(f"{path}: not a checkpoint receipt")
    return {str(name): int(size) for name, size in files.items()}


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or name == MANIFEST_NAME:
        raise ValueError(f"checkpoint file name {name!r} is reserved or not a plain name")
