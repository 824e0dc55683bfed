"""Asking the kernel to start writing a file's bytes to disk now, without waiting for them.

A checkpoint's fsync at the end of a file waits for every byte the page cache still holds; told
as the bytes go out (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``), the disk writes while the
framework serializes the rest, and the fsync finds little left. Only a hint: it makes nothing
durable (the fsync still does), and where the call is missing (not Linux, a C library without it)
or refused (a file system that does not support it) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


@functools.cache
def _call() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols (glibc, musl): no search for the library (find_library runs ldconfig)
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing ``length`` bytes of ``fd`` from ``offset`` to disk; False where it could not."""
    call = _call()
    return call is not None and call(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0
