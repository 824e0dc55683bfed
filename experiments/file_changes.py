"""Which watched files were written since they were last read: the kernel's inotify, for the
controller's tails (experiments.layout.JsonlTail) of files on this host's own filesystem (issue 29:
a round reads only what changed; a run in flight has five files a round, most with nothing new).

One ``FileChanges`` a controller: a directory is watched (IN_MODIFY, IN_CREATE, IN_MOVED_TO) while a
tail of a file in it lives (counted; released when the last such tail is collected); ``drain``, once
a round before the reads, takes in what the kernel queued; ``take(directory, name)`` says whether
that file was written since its last take. What the kernel could not queue (IN_Q_OVERFLOW) moves
``generation``: every tail reads once again; so does a directory that went or moved (its tails look
with a stat from then on: a watch follows the directory, not its path), and, as a safety net, every
RELOOK_S (a directory deleted while a process still holds it sends nothing until it lets go). A
tail reads its file itself right after its directory's watch is added (what was written before the
watch is in no event). A finished run's tails are dropped (AttemptWatch.close_files): the watches
follow the runs in flight, not the sweep.

Not for a network filesystem: inotify sees this host's own writes only, not another node's
(experiments.runtime.mounts decides; there every file is still opened each round). Where inotify
cannot be had (not Linux, the user's instances used up: max_user_instances, or its watches:
max_user_watches), ``open`` gives None or ``watch`` False, and the tails look with a stat."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import weakref
from dataclasses import dataclass, field
from time import monotonic

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400  # the directory itself deleted (once nothing holds it)
IN_MOVE_SELF = 0x00000800  # the directory itself renamed: its events would go on under the old path
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000  # the watch was removed (its directory deleted, or rm_watch)
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WATCHED = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
GONE = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF
# Every tail looks again this often whatever the kernel said: a directory deleted while a process
# still holds it (no event until it lets go) and then made again is read at the latest this late.
RELOOK_S = 5.0
EVENT_HEAD = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
READ_BYTES = 1 << 16


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the interpreter's own symbols: its C library, already loaded (find_library starts a process)
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "inotify_init1") else None
    except OSError:
        return None


@dataclass
class _Directory:
    descriptor: int  # the kernel's watch descriptor
    tails: int = 0  # the tails of files in it that live
    written: set[str] = field(default_factory=set)  # names written since their last take


class FileChanges:
    def __init__(self, libc: ctypes.CDLL, descriptor: int) -> None:
        self._libc, self._fd = libc, descriptor
        self._closer = weakref.finalize(self, os.close, descriptor)  # a controller never closed: at its collection
        self._by_path: dict[str, _Directory] = {}
        self._by_descriptor: dict[int, str] = {}
        self.generation = 0  # moves when the kernel dropped events (and every RELOOK_S): every tail reads again
        self._relooked = monotonic()

    @classmethod
    def open(cls) -> "FileChanges | None":
        libc = _libc()
        if libc is None:
            return None
        descriptor = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        return cls(libc, descriptor) if descriptor >= 0 else None

    def watch(self, directory: str) -> bool:
        """Count a tail of a file in ``directory``; False where it cannot be watched (not there
        yet, no watch left, the same directory already watched under another path)."""
        known = self._by_path.get(directory)
        if known is not None:
            known.tails += 1
            return True
        descriptor = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCHED)
        if descriptor < 0:
            return False  # ENOENT (the job has not made it yet), ENOSPC (max_user_watches), EACCES
        if descriptor in self._by_descriptor:  # one inode under two paths: its events name the other
            return False
        self._by_descriptor[descriptor] = directory
        self._by_path[directory] = _Directory(descriptor, tails=1)
        return True

    def release(self, directory: str) -> None:
        """A tail of a file in ``directory`` is gone; the watch with the last one."""
        known = self._by_path.get(directory)
        if known is None:
            return
        known.tails -= 1
        if known.tails > 0:
            return
        del self._by_path[directory]
        if known.descriptor >= 0 and self._fd >= 0:
            self._by_descriptor.pop(known.descriptor, None)
            self._libc.inotify_rm_watch(self._fd, known.descriptor)

    def drain(self) -> None:
        """Take in every event the kernel queued (without waiting); every RELOOK_S, every tail looks."""
        now = monotonic()
        if now - self._relooked >= RELOOK_S:
            self._relooked = now
            self.generation += 1
        while True:
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno == errno.EINTR:
                    continue
                raise
            self._take_in(data)

    def _take_in(self, data: bytes) -> None:
        offset = 0
        while offset + EVENT_HEAD.size <= len(data):
            descriptor, mask, _cookie, length = EVENT_HEAD.unpack_from(data, offset)
            name = data[offset + EVENT_HEAD.size:offset + EVENT_HEAD.size + length].rstrip(b"\0")
            offset += EVENT_HEAD.size + length
            if mask & IN_Q_OVERFLOW:
                self.generation += 1
                continue
            directory = self._by_descriptor.get(descriptor)
            if directory is None:
                continue
            if mask & GONE:  # its directory went (or moved): its tails look with a stat from now on
                self._by_descriptor.pop(descriptor, None)
                self._by_path[directory].descriptor = -1
                if not mask & IN_IGNORED:
                    self._libc.inotify_rm_watch(self._fd, descriptor)
                self.generation += 1
                continue
            if name:
                self._by_path[directory].written.add(os.fsdecode(name))

    def watching(self, directory: str) -> bool:
        known = self._by_path.get(directory)
        return known is not None and known.descriptor >= 0

    def take(self, directory: str, name: str) -> bool:
        """``name`` in ``directory`` was written since its last take (one taker a file)."""
        known = self._by_path.get(directory)
        if known is None or known.descriptor < 0:
            return True
        if name in known.written:
            known.written.discard(name)
            return True
        return False

    def close(self) -> None:
        if self._fd >= 0:
            self._closer()
            self._fd = -1
            self._by_path.clear()
            self._by_descriptor.clear()
