"""The processes of this machine as /proc shows them: children by parent, a process's environment."""

from __future__ import annotations

from pathlib import Path


def children_of(parent: int, zombies: bool = False) -> list[int]:
    """The processes whose parent is ``parent`` (zombies too if asked), by a scan of /proc (the
    kernel's /proc/<pid>/task/*/children is not built into every kernel)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and int(fields[1]) == parent and (zombies or fields[0] != "Z"):
            children.append(int(entry.name))
    return children


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with; None where it is gone or not ours to read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}
