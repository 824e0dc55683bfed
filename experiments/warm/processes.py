"""The end of a warm job's member processes, for either host (local job, Slurm batch script)."""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

Process = TypeVar("Process")
Launch = TypeVar("Launch", bound="subprocess.Popen[Any]")  # a host's launches: bytes (batch host) or text (local)

EXIT_S = 30.0  # after the coordinator's verdict, the members' time to leave on their own
RETIRE_S = 10.0  # a retired set's time to exit once stopped, before it is killed


def end_members(processes: Iterable[Launch], stop: Callable[[Launch], None], grace_s: float = EXIT_S) -> None:
    """Wait up to ``grace_s`` for every process to exit (the spares leave on the coordinator's word),
    then ``stop`` the rest (Popen.kill, or terminate for an srun that ends its step) and reap them."""
    members = list(processes)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(member.poll() is None for member in members):
        time.sleep(0.05)
    for member in members:
        if member.poll() is None:
            stop(member)
    for member in members:
        try:
            member.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            member.kill()
            member.wait()


def retire(processes: Iterable[Launch], stop: Callable[[Launch], None], wait_s: float = RETIRE_S) -> None:
    """``stop`` each live process and wait until it has exited (SIGKILL after ``wait_s``): a retired
    set's rank 0 may still be publishing or pruning a checkpoint in the background, and the next
    set is fenced and planned only once nothing of the old one can write."""
    members = [member for member in processes if member.poll() is None]
    for member in members:
        stop(member)
    deadline = time.monotonic() + wait_s
    for member in members:
        try:
            member.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            member.kill()
            member.wait()


def processes_of(by_slot: Mapping[int, Process], slots: Iterable[int]) -> list[Process]:
    """The distinct processes behind ``slots`` (a set launched by one launcher holds several slots)."""
    unique: dict[int, Process] = {}
    for slot in slots:
        if slot in by_slot:
            unique.setdefault(id(by_slot[slot]), by_slot[slot])
    return list(unique.values())
