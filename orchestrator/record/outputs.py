"""Identity for the user's own script: the files it leaves at the end (``workload.outputs``, globs
relative to its working directory), compared between a run and its fault-free twin.

Per file: ``identical``, ``differs`` (with the largest absolute difference over its tensors, and the
tensor that has it, for the formats whose tensors can be read: torch ``.pt``/``.pth``/``.bin``
(``torch.load`` with ``weights_only``), ``.safetensors``, Keras/HDF5 ``.keras``/``.h5``, NumPy
``.npz``/``.npy``; byte equality for any other file), or ``missing`` (one side has no such file).
A run is identical only if every file is; one missing file makes it ``missing``.

Memory (the controller's, on a login node): each file is hashed once, streamed; files equal byte for
byte are identical without being read as tensors; a file that unpacks to more than
TENSOR_FILE_BYTES_AT_MOST (a zip's members: .npz, .keras, torch) is compared byte for byte; torch files
are memory-mapped where their format allows (bfloat16 and float8 tensors are still widened in
memory); each pair of tensors is compared DIFF_CHUNK values at a time.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

IDENTICAL, DIFFERS, MISSING = "identical", "differs", "missing"
NOT_CHECKED = "identity not checked (name the files the script leaves in workload.outputs)"
TENSORS_AT_MOST = 100_000  # arrays read per file: a pathological checkpoint cannot make this unbounded
INTS_EXACT_AT_MOST = 1 << 20  # integer arrays up to this size are compared exactly (as Python ints)
TENSOR_FILE_BYTES_AT_MOST = 4 << 30  # larger files are compared byte for byte (both sides are read at once)
DIFF_CHUNK = 1 << 20  # elements of a tensor pair compared at a time


@dataclass(frozen=True)
class FileVerdict:
    name: str
    verdict: str
    max_abs_diff: float | None = None  # over the file's tensors; None where it is compared byte for byte
    worst: str | None = None  # the tensor with that difference
    how: str = "bytes"


@dataclass(frozen=True)
class OutputsVerdict:
    verdict: str
    max_abs_diff: float | None
    files: list[FileVerdict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "max_abs_diff": self.max_abs_diff, "files": [asdict(f) for f in self.files]}


def matched_outputs(cwd: Path, globs: list[str]) -> dict[str, Path]:
    """The regular files ``globs`` match under ``cwd``, by their name relative to it (a link that
    leads out of it is not the run's output)."""
    found: dict[str, Path] = {}
    root = cwd.resolve()
    for pattern in globs:
        for path in cwd.glob(pattern):
            if path.is_file() and path.resolve().is_relative_to(root):
                found[str(path.relative_to(cwd))] = path
    return found


def compare_outputs(run_cwd: Path, twin_cwd: Path, globs: list[str]) -> OutputsVerdict:
    """``globs`` (relative, checked at load: orchestrator/campaign/spec.py output_glob_problem) in the run's working
    directory against the same in its twin's."""
    mine, theirs = matched_outputs(run_cwd, globs), matched_outputs(twin_cwd, globs)
    files = [compare_file(name, mine.get(name), theirs.get(name)) for name in sorted(set(mine) | set(theirs))]
    if not files:
        return OutputsVerdict(MISSING, None, [FileVerdict(", ".join(globs), MISSING, how="no file matched")])
    verdicts = {f.verdict for f in files}
    verdict = MISSING if MISSING in verdicts else DIFFERS if DIFFERS in verdicts else IDENTICAL
    if verdict == IDENTICAL:
        return OutputsVerdict(verdict, 0.0, files)
    # Of the files that differ; none if one of them differs only as bytes (no size to give).
    differing = [f for f in files if f.verdict == DIFFERS]
    sized = all(f.max_abs_diff is not None for f in differing) and differing
    return OutputsVerdict(verdict, max(f.max_abs_diff or 0.0 for f in differing) if sized else None, files)


def compare_file(name: str, mine: Path | None, theirs: Path | None) -> FileVerdict:
    if mine is None or theirs is None:
        return FileVerdict(name, MISSING, how=f"only the {'twin' if mine is None else 'run'} has it")
    by_bytes = _byte_verdict(name, mine, theirs)  # each file hashed once (streamed)
    reader = _reader(name)
    if reader is None or by_bytes.verdict == MISSING:
        return by_bytes
    if by_bytes.verdict == IDENTICAL:  # whatever it holds: nothing to read as tensors
        return replace(by_bytes, max_abs_diff=0.0, how="bytes (equal)")
    largest = max(_unpacked_size(mine), _unpacked_size(theirs))
    if largest > TENSOR_FILE_BYTES_AT_MOST:
        return replace(by_bytes, how=(f"bytes ({largest / 2**30:.1f} GiB unpacked: files over "
                                      f"{TENSOR_FILE_BYTES_AT_MOST / 2**30:g} GiB are not read as tensors)"))
    try:
        return _tensor_verdict(name, dict(reader(mine)), dict(reader(theirs)))
    except Exception as error:  # an unreadable file of a known suffix: its bytes still say
        hint = "; a torch file of tensors alone (a state_dict) is compared by value" if reader is _torch_tensors else ""
        return replace(by_bytes, how=f"bytes ({type(error).__name__} reading its tensors{hint})")


def _unpacked_size(path: Path) -> int:
    """What reading the file's tensors takes at least: a zip's members unpacked (.npz, .keras, a
    torch file), an HDF5 file's datasets as its metadata sizes them (they may be compressed), else
    its size on disk."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                unpacked = sum(member.file_size for member in archive.infolist())
                if path.suffix == ".keras" and unpacked <= TENSOR_FILE_BYTES_AT_MOST:
                    unpacked = max(unpacked, _h5_datasets_size(io.BytesIO(archive.read("model.weights.h5"))))
                return unpacked
        if path.suffix in (".h5", ".hdf5"):
            return max(path.stat().st_size, _h5_datasets_size(path))
        return path.stat().st_size
    except (OSError, KeyError, zipfile.BadZipFile):
        return 0


def _h5_datasets_size(source: Path | io.BytesIO) -> int:
    """The bytes an HDF5 file's datasets take once read, from its metadata alone."""
    import h5py  # type: ignore[import-untyped,unused-ignore]  # h5py ships no type hints

    sizes: list[int] = []
    with h5py.File(source, "r") as file:
        file.visititems(lambda _, item: sizes.append(item.size * item.dtype.itemsize)
                        if isinstance(item, h5py.Dataset) else None)
    return sum(sizes)


def _byte_verdict(name: str, mine: Path, theirs: Path, how: str = "bytes") -> FileVerdict:
    try:
        if mine.stat().st_size != theirs.stat().st_size:  # no need to read either
            return FileVerdict(name, DIFFERS, how=how)
        same = _sha256(mine) == _sha256(theirs)
    except OSError as error:
        return FileVerdict(name, MISSING, how=f"unreadable: {error.strerror or error}")
    return FileVerdict(name, IDENTICAL if same else DIFFERS, how=how)


def _tensor_verdict(name: str, mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> FileVerdict:
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs))[:3]
        return FileVerdict(name, DIFFERS, float("inf"), f"tensors only one side has: {', '.join(only)}", "tensors")
    worst, largest = None, 0.0
    for key in sorted(mine):
        a, b = mine[key], theirs[key]
        if a.shape != b.shape:
            return FileVerdict(name, DIFFERS, float("inf"), f"{key} (shape {a.shape} vs {b.shape})", "tensors")
        diff = _max_abs_diff(a, b)
        if diff > largest or (worst is None and diff > 0):
            worst, largest = key, diff
    return FileVerdict(name, IDENTICAL if largest == 0 else DIFFERS, largest, worst, "tensors")


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """0 where the values are equal (infinities and NaN alike included), else the largest absolute
    difference (inf: a NaN against a number, or values that are not numbers and differ)."""
    numeric = a.dtype.kind in "fiub" and b.dtype.kind in "fiub"
    if not numeric:
        return 0.0 if np.array_equal(a, b) else float("inf")
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":  # exact: int64 beyond 2**53 is not a float64
        diff = np.abs(a.astype(object) - b.astype(object)) if a.size <= INTS_EXACT_AT_MOST else None
        if diff is not None:
            return float(max(diff.flat, default=0))
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    return max((_chunk_diff(flat_a[start:start + DIFF_CHUNK], flat_b[start:start + DIFF_CHUNK])
                for start in range(0, flat_a.size, DIFF_CHUNK)), default=0.0)


def _chunk_diff(a: np.ndarray, b: np.ndarray) -> float:
    first, second = a.astype(np.float64), b.astype(np.float64)
    equal = (first == second) | (np.isnan(first) & np.isnan(second))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(equal, 0.0, np.nan_to_num(np.abs(first - second), nan=np.inf))
    return float(np.max(diff, initial=0.0))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


Reader = Callable[[Path], Iterator[tuple[str, np.ndarray]]]


def _reader(name: str) -> Reader | None:
    lowered = name.lower()
    for suffixes, reader in (((".pt", ".pth", ".bin", ".ckpt"), _torch_tensors), ((".safetensors",), _safetensors),
                             ((".keras",), _keras_tensors), ((".h5", ".hdf5"), _h5_tensors),
                             ((".npz",), _npz_tensors), ((".npy",), _npy_tensor)):
        if lowered.endswith(suffixes):
            return reader
    return None


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
    """Tensors, arrays and plain values of a nested structure (a state dict, an optimizer's state),
    by path."""
    import torch

    FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        # NumPy has no bfloat16 (nor float8): widened, every value exactly as it was.
        yield prefix, (tensor.float() if tensor.dtype in (torch.bfloat16, *FLOAT8) else tensor).numpy()
    elif isinstance(value, np.ndarray):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _flatten(item, f"{prefix}[{index}]")
    elif isinstance(value, (int, float, bool, str)):
        yield prefix, np.asarray(value)


def _bounded(items: Iterator[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    for count, item in enumerate(items):
        if count >= TENSORS_AT_MOST:
            raise ValueError(f"more than {TENSORS_AT_MOST} arrays")
        yield item


def _torch_tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    import torch

    try:  # memory-mapped: its tensors are read as they are compared
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be mapped
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    return _bounded(_flatten(loaded))


def _safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    import safetensors.numpy  # type: ignore[import-not-found,unused-ignore]  # optional: may be absent

    return _bounded(iter(safetensors.numpy.load_file(str(path)).items()))


def _h5_tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    import h5py  # type: ignore[import-untyped,unused-ignore]  # h5py ships no type hints

    found: list[tuple[str, np.ndarray]] = []
    with h5py.File(path, "r") as file:
        file.visititems(lambda key, item: found.append((key, item[()])) if isinstance(item, h5py.Dataset) else None)
    return _bounded(iter(found))


def _keras_tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """A ``.keras`` file is a zip whose weights are ``model.weights.h5``."""
    import h5py  # type: ignore[import-untyped,unused-ignore]  # h5py ships no type hints

    with zipfile.ZipFile(path) as archive:
        data = archive.read("model.weights.h5")
    found: list[tuple[str, np.ndarray]] = []
    with h5py.File(io.BytesIO(data), "r") as file:
        file.visititems(lambda key, item: found.append((key, item[()])) if isinstance(item, h5py.Dataset) else None)
    return _bounded(iter(found))


def _npz_tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        return _bounded(iter([(key, archive[key]) for key in archive.files]))


def _npy_tensor(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    return iter([("array", np.load(path, allow_pickle=False))])
