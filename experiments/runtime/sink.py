"""Durable file writes for one rank's share of a checkpoint: temporary name, fsync, rename.

A rank killed mid-write leaves only a hidden temporary file, never a truncated file under the
final name; the store ignores hidden names when it hashes the checkpoint.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from experiments.layout import MANIFEST_NAME, fsync_dir


class FileSink:
    """Hands out files inside one (partial) checkpoint directory; the workload writes through it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.written: dict[str, int] = {}  # name -> bytes, for this rank's own accounting

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

    def close(self) -> None:
        """Make this rank's renames durable before it reports its share written (the barrier)."""
        fsync_dir(self.directory)


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or name == MANIFEST_NAME:
        raise ValueError(f"checkpoint file name {name!r} is reserved or not a plain name")
