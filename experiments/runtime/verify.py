"""Is a published checkpoint usable: its manifest, sizes and hashes (the algorithm its manifest
names: experiments.runtime.integrity), read with retries.

Three kinds of problem, because they call for different actions: *invalid* (the bytes on disk prove
the checkpoint bad: no manifest, a size or hash that does not match) and *unreadable* (the storage
failed to answer: EIO, ESTALE on NFS) keep a checkpoint out of the choice; neither is a reason to
delete it (the store moves such checkpoints aside, experiments.runtime.checkpoint). *Uncheckable*
(hashed with an algorithm this Python lacks) says nothing of the checkpoint: the store stops there
rather than fall back past it. A read is retried a few times first, since network file systems fail
transiently.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from experiments.layout import MANIFEST_NAME
from experiments.runtime.integrity import LEGACY_ALGORITHM, HashUnavailable, digest_file

log = logging.getLogger(__name__)

READ_RETRY_DELAYS_S = (0.05, 0.2, 0.5)  # then the read counts as failed
INVALID = "invalid"
UNREADABLE = "unreadable"
# Hashed with an algorithm this Python cannot compute (experiments.runtime.integrity): not the
# checkpoint's fault, and no storage failure either; the store stops rather than pass it by.
UNCHECKABLE = "uncheckable"

T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    kind: str  # INVALID or UNREADABLE
    text: str

    def __str__(self) -> str:
        return self.text


def retrying_read(read: Callable[[], T], what: str, delays_s: tuple[float, ...] = READ_RETRY_DELAYS_S) -> T:
    """``read()``, tried again after each delay when it raises OSError (not a missing file)."""
    for delay in delays_s:
        try:
            return read()
        except FileNotFoundError:
            raise
        except OSError as error:
            log.warning("reading %s failed (%s); retrying in %.2f s", what, error, delay)
            time.sleep(delay)
    return read()


def file_hash(path: Path, algorithm: str) -> str:
    """The file's hex digest under ``algorithm`` (experiments.runtime.integrity), read with retries."""
    return retrying_read(lambda: digest_file(path, algorithm), str(path))


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path`` (OSError after the retries, ValueError if not JSON)."""
    def load() -> Any:
        with open(path / MANIFEST_NAME) as handle:
            return json.load(handle)

    manifest = retrying_read(load, str(path / MANIFEST_NAME))
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not a JSON object")
    return manifest


def verify_checkpoint(path: Path, step: int, verify_hashes: bool = True) -> Problem | None:
    """Why the checkpoint at ``path`` cannot be used, or None when it can."""
    return check_checkpoint(path, step, verify_hashes)[1]


def check_checkpoint(path: Path, step: int, verify_hashes: bool = True) -> tuple[dict[str, Any] | None, Problem | None]:
    """The checkpoint's manifest and, if it cannot be used, why (the manifest is None if unread)."""
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return None, Problem(INVALID, "no manifest")
    except ValueError as error:
        return None, Problem(INVALID, f"garbled manifest ({error})")
    except OSError as error:
        return None, Problem(UNREADABLE, f"manifest unreadable ({error})")
    files, sizes = manifest.get("files"), manifest.get("sizes")
    if not isinstance(files, dict) or not isinstance(sizes, dict) or set(files) != set(sizes):
        return manifest, Problem(INVALID, "manifest lacks matching 'files' and 'sizes' tables")
    if manifest.get("step") != step:
        return manifest, Problem(INVALID, f"manifest step {manifest.get('step')!r} does not match the directory name")
    algorithm = manifest.get("hash_algorithm", LEGACY_ALGORITHM)  # none named: written before BLAKE3
    if not isinstance(algorithm, str):
        return manifest, Problem(INVALID, f"garbled manifest (hash_algorithm {algorithm!r})")
    for name, expected_hash in sorted(files.items()):
        problem = _verify_file(path / name, sizes[name], expected_hash, algorithm if verify_hashes else None)
        if problem:
            return manifest, Problem(problem.kind, f"{name}: {problem.text}")
    return manifest, None


def _verify_file(path: Path, size: Any, expected_hash: Any, algorithm: str | None) -> Problem | None:
    """``algorithm`` None: the size alone is checked."""
    try:
        actual_size = retrying_read(lambda: path.stat().st_size, str(path))
        if actual_size != size:
            return Problem(INVALID, f"size {actual_size} bytes, manifest says {size}")
        if algorithm is not None and file_hash(path, algorithm) != expected_hash:
            return Problem(INVALID, f"{algorithm} mismatch")
    except HashUnavailable as error:  # not the checkpoint's fault: it cannot be checked here
        return Problem(UNCHECKABLE, f"cannot be checked here: {error}")
    except FileNotFoundError:
        return Problem(INVALID, "missing")
    except OSError as error:
        return Problem(UNREADABLE, f"unreadable ({error})")
    return None
