"""A run's final weights as one digest: what a resumed run is compared to its fault-free twin by,
bit for bit. NumPy is imported here only, when weights are digested (the rank API itself needs
nothing beyond Python)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import numpy as np


def digest_arrays(named: Iterable[tuple[str, np.ndarray]]) -> str:
    """sha256 over (name, dtype, shape, little-endian C-order bytes), sorted by name.

    Framework-neutral on purpose: two frameworks holding the same weights give the same digest,
    and the digest does not depend on the order a framework happens to list its parameters.
    """
    import numpy as np

    digest = hashlib.sha256()
    for name, array in sorted(named, key=lambda item: item[0]):
        canonical = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        digest.update(name.encode())
        digest.update(canonical.dtype.str.encode())
        digest.update(repr(tuple(canonical.shape)).encode())
        digest.update(canonical.tobytes())
    return digest.hexdigest()
