"""Which filesystem a path is on, as this node's mount table says (the longest mount point that
holds it), and whether the drill may treat it as this host's own.

Only the types known to keep their data on this host count as local. Anything else — a network
filesystem (other nodes see its writes late, through attribute caches, and each metadata operation
is a round trip to its server), any FUSE filesystem (sshfs, ceph-fuse, juicefs, gcsfuse: what is
behind it is unknown), a type this list does not know, or a mount table that cannot be read — is
treated as shared: SQLite keeps a rollback journal there (WAL's index is one host's shared memory)
and heartbeats are written at the shared rate. Wrongly "shared" costs speed; wrongly "local" costs
a corrupt ledger. ``overlay`` is local: the root of a container, whose upper layer the kernel's
overlayfs keeps on a local filesystem (it does not take NFS as an upper layer)."""

from __future__ import annotations

import re
from pathlib import Path

LOCAL_TYPES = ("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "bcachefs", "tmpfs", "ramfs",
               "overlay")
MOUNTINFO = Path("/proc/self/mountinfo")
UNKNOWN = "?"
_ESCAPE = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and backslash as \040 ...


def filesystem_type(path: Path, mountinfo: str | None = None) -> str:
    """The type of the filesystem ``path`` is on (``path`` itself resolved, links included; "?"
    where the mount table cannot be read or does not say)."""
    try:
        text = mountinfo if mountinfo is not None else MOUNTINFO.read_text()
    except OSError:
        return UNKNOWN
    resolved, best, kind = str(path.resolve()), "", UNKNOWN
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = unescape(fields[4])
        after = line.split(" - ", 1)[1].split()
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best) and after:
            best, kind = point, after[0]
    return kind


def unescape(field: str) -> str:
    """A mount table field with its octal escapes decoded."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def is_local(kind: str) -> bool:
    """A filesystem type known to keep its data on this host."""
    return kind in LOCAL_TYPES


def on_local_filesystem(path: Path, mountinfo: str | None = None) -> bool:
    return is_local(filesystem_type(path, mountinfo))


def on_network_filesystem(path: Path, mountinfo: str | None = None) -> bool:
    """Not known to be this host's own (see the module's doc): treated as shared."""
    return not on_local_filesystem(path, mountinfo)
