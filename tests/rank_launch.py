"""Helpers shared by the tests that start real ranks on this machine (no scheduler)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port_pair() -> int:
    """A port p with p and p + 1 free: some frameworks (TensorFlow) listen on one port per rank,
    an explicit port being the first of the block."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.01) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def logs(run_dir: Path, pattern: str = "rank*.log") -> str:
    """The tail of every rank log in ``run_dir``, for assertion messages."""
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(run_dir.glob(pattern)))
