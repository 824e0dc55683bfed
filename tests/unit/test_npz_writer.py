"""The Chainer checkpoint's .npz writer (experiments/workloads/npz_writer.py): what it writes reads
back with numpy.load as numpy.savez's own file does, array for array, and zipfile checks each
member's CRC on the way (a damaged byte is caught)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from experiments.workloads import npz_writer
from experiments.workloads.npz_writer import write_npz


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "model/l1/W": rng.standard_normal((300, 70)).astype(np.float32),
        "model/l1/b": np.zeros(70, np.float32),
        "optimizer/t": np.array(12),  # a 0-d array, as Chainer serializes a number
        "optimizer/l1/W/m": np.asfortranarray(rng.standard_normal((30, 7))),  # not C-ordered in memory
        "empty": np.empty((0, 3), np.int64),
        "rng/key": rng.integers(0, 2**32, 624, dtype=np.uint32),
        "model/poids_é/W": np.ones(3, np.float32),  # a link named in Unicode: a UTF-8 name, flagged so
    }


def test_it_reads_back_as_numpy_savez_writes_it(tmp_path: Path) -> None:
    arrays = _arrays()
    ours, numpys = tmp_path / "ours.npz", tmp_path / "numpy.npz"
    with open(ours, "wb") as handle:
        write_npz(handle, arrays)
    np.savez(numpys, **arrays)
    with np.load(ours, allow_pickle=False) as read, np.load(numpys, allow_pickle=False) as expected:
        assert sorted(read.files) == sorted(expected.files) == sorted(arrays)
        for key in arrays:
            assert read[key].dtype == expected[key].dtype and read[key].shape == expected[key].shape
            assert np.array_equal(read[key], expected[key])
    with zipfile.ZipFile(ours) as archive:
        assert archive.testzip() is None  # every member's CRC as the central directory says
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())


def test_a_member_bigger_than_the_write_chunk_and_a_damaged_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npz_writer, "WRITE_CHUNK", 4096)  # many chunks, as a 1 GiB state has
    big = {"w": np.arange(100_000, dtype=np.float64)}
    path = tmp_path / "big.npz"
    with open(path, "wb") as handle:
        write_npz(handle, big)
    with np.load(path) as read:
        assert np.array_equal(read["w"], big["w"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the array's bytes
    with pytest.raises(zipfile.BadZipFile, match="CRC"), np.load(io.BytesIO(bytes(data))) as read:
        read["w"]
