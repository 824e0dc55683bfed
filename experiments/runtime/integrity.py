"""The integrity hash of checkpoint files: BLAKE3 where the ``blake3`` package is installed
(Faultdrill's own environment always; the rank API's wheel with its extra ``blake3``), else sha256.

A checkpoint's manifest records the algorithm its files were hashed with (``hash_algorithm``); one
that records none was written before BLAKE3 and is sha256, so old checkpoints keep verifying.
BLAKE3 runs at ~5 GB/s on one core here against sha256's ~1 GB/s (SHA-NI): with it, hashing a file
costs less than writing it (BENCHMARKS.md, checkpoint throughput). Both are cryptographic: a
checkpoint damaged on purpose (corrupt-checkpoint) or by storage does not verify under either.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from pathlib import Path
from typing import Any

SHA256 = "sha256"
BLAKE3 = "blake3"
ALGORITHMS = (BLAKE3, SHA256)
LEGACY_ALGORITHM = SHA256  # a manifest or receipt that names no algorithm
_CHUNK = 4 << 20


class HashUnavailable(ValueError):
    """An algorithm this Python cannot compute: unknown, or its package is not installed."""


@functools.cache  # looked up once (where it is missing, each lookup would search sys.path again)
def _blake3() -> Any:
    try:
        import blake3
    except ImportError:
        return None
    return blake3.blake3


def default_algorithm() -> str:
    """The algorithm new checkpoints are hashed with here."""
    return BLAKE3 if _blake3() is not None else SHA256


def new_hasher(algorithm: str, every_core: bool = False) -> Any:
    """A fresh hasher (``update``, ``hexdigest``) of ``algorithm``; ``every_core``: BLAKE3 on every
    core of the node (the same digest on any number of threads), else on one."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == BLAKE3:
        blake3 = _blake3()
        if blake3 is None:
            raise HashUnavailable("hashed with blake3, which this Python lacks (pip install blake3, or the rank "
                                  "API's extra: faultdrill-rank[blake3])")
        threads = getattr(blake3, "AUTO", None) if every_core else None
        return blake3() if threads is None else blake3(max_threads=threads)
    raise HashUnavailable(f"unknown hash algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")


def digest_file(path: Path, algorithm: str) -> str:
    """The hex digest of the file at ``path`` (read in 4 MiB chunks: from the page cache, just written)."""
    hasher = new_hasher(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return str(hasher.hexdigest())


def digest_fresh_file(path: Path, algorithm: str) -> str:
    """``digest_file`` of a file this process has just written and no one else changes: BLAKE3
    maps it (a file cut short while mapped would end the process with SIGBUS, which is why files
    read for verification are read, not mapped) and hashes it on every core while training waits for
    the save (the main thread's), on one beside training (an asynchronous save's persist thread: the
    node's other ranks train on those cores)."""
    hasher = new_hasher(algorithm, every_core=threading.current_thread() is threading.main_thread())
    if not hasattr(hasher, "update_mmap"):  # sha256, or a blake3 package older than 0.4
        return digest_file(path, algorithm)
    try:
        return str(hasher.update_mmap(path).hexdigest())
    except (OSError, ValueError):  # a file system that cannot map it (FUSE direct I/O): read it
        return digest_file(path, algorithm)
