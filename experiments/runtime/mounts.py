"""Which filesystem a path is on, as this node's mount table says (the longest mount point that
holds it), and whether that is a network filesystem: other nodes see its writes late (attribute
caches), and each metadata operation is a round trip to its server."""

from __future__ import annotations

from pathlib import Path

NETWORK_TYPES = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse.sshfs", "ceph", "fuse.glusterfs",
                 "panfs", "wekafs")
MOUNTINFO = Path("/proc/self/mountinfo")


def filesystem_type(path: Path, mountinfo: str | None = None) -> str:
    """The type of the filesystem ``path`` is on ("?" where the mount table does not say)."""
    try:
        text = mountinfo if mountinfo is not None else MOUNTINFO.read_text()
    except OSError:
        return "?"
    resolved, best, kind = str(path.resolve()), "", "?"
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        after = line.split(" - ", 1)[1].split()
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best) and after:
            best, kind = point, after[0]
    return kind


def on_network_filesystem(path: Path, mountinfo: str | None = None) -> bool:
    return filesystem_type(path, mountinfo) in NETWORK_TYPES
