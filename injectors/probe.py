"""What ``faultdrill doctor`` asks of a compute node, run there as the user's job would run.

``facts --out-dir DIR [--framework F] [--checkpoints CK --mark TOKEN]``: this node's facts as one
JSON file in DIR (a folder the login node reads: on the shared filesystem), named after the node as
the scheduler names it: its host, its clock at the moment of writing, the Python that runs here and
whether it imports the framework, whether this user may cap a rank's memory or the scheduler's
cgroup limits the job's (oom-rank); with CK,
whether it sees the file this doctor run (TOKEN) left there and may write its own. Written
atomically (a temporary name, then a rename).

``unmark --checkpoints CK --mark TOKEN``: this node's file of that run removed from CK (the test
job's last step, once the doctor is done).

``echo``: the node's clock, once for each line read on stdin, until stdin ends: the login node
times each exchange and takes the offset of the quickest (an NTP-like estimate whose uncertainty
is half that round trip).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from injectors.memory_cgroup import can_cap_memory, job_memory_limit
from injectors.targets import TargetRefused

FACTS_PREFIX = "facts-"
ECHO_READY = "ready"


MARK_PREFIX = ".faultdrill-doctor-"  # the doctor's files in the checkpoint directory: one run's by its token
_TOKEN = re.compile(r"^[0-9a-f]{8,64}$")


def login_mark(token: str) -> str:
    """The name of the file the login node leaves in the checkpoint directory for doctor run ``token``."""
    return f"{MARK_PREFIX}{_checked(token)}-login"


def node_mark(token: str, node: str) -> str:
    """The name of the file ``node`` writes there for doctor run ``token``."""
    return f"{MARK_PREFIX}{_checked(token)}-node-{node}"


def _checked(token: str) -> str:
    if not _TOKEN.match(token):
        raise ValueError(f"a doctor run's token is 8 to 64 lowercase hex digits, not {token!r}")
    return token


def node_name(environ: Mapping[str, str], hostname: str) -> str:
    """This node as the scheduler names it (what the login node asks for, and matches facts by):
    Slurm's SLURMD_NODENAME; under PBS, the entry of the job's node file that is this host (its
    short name the same); else the host name."""
    if environ.get("SLURMD_NODENAME"):
        return environ["SLURMD_NODENAME"]
    short = hostname.split(".")[0]
    return next((entry for entry in _nodefile(environ) if entry.split(".")[0] == short), hostname)


def _job_memory_limit_mb() -> float | None:
    """The memory limit the scheduler's cgroup sets on this job (oom-rank outgrows it), if any."""
    try:
        found = job_memory_limit(os.getpid())
    except (OSError, TargetRefused):
        return None
    return found.limit_bytes / 2**20 if found is not None else None


def _nodefile(environ: Mapping[str, str]) -> list[str]:
    try:
        return Path(environ["PBS_NODEFILE"]).read_text().split() if environ.get("PBS_NODEFILE") else []
    except OSError:
        return []


def facts(framework: str | None, checkpoints: Path | None = None, token: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"node": node_name(os.environ, socket.gethostname()), "host": socket.gethostname(),
                             "python": sys.executable, "python_version": platform.python_version(),
                             "uid": os.geteuid(), "memory_cap": can_cap_memory(os.getpid()),
                             "job_memory_limit_mb": _job_memory_limit_mb()}
    if checkpoints is not None:
        found["checkpoints"] = checkpoint_facts(checkpoints, found["node"], token)
    if framework:
        found["framework"] = framework
        try:
            module = importlib.import_module(framework)
            found["framework_version"] = str(getattr(module, "__version__", "?"))
        except Exception as error:  # whatever the import raises is what the drill would meet
            found["framework_error"] = f"{type(error).__name__}: {error}"[:500]
    found["written_at"] = time.time()
    return found


def checkpoint_facts(directory: Path, node: str, token: str) -> dict[str, Any]:
    """Whether this node sees the checkpoint directory as the login node does (the file doctor run
    ``token`` left there) and may write there (a file of this node's, which the login node looks for)."""
    said: dict[str, Any] = {"sees_login_file": (directory / login_mark(token)).is_file()}
    try:
        (directory / node_mark(token, node)).write_text(str(time.time()))
        said["wrote"] = True
    except OSError as error:
        said["wrote"], said["error"] = False, f"{error.strerror}"
    return said


def unmark(checkpoints: Path, token: str) -> None:
    """This node's file of doctor run ``token`` removed from the checkpoint directory (the job's
    last step: a directory private to the node is seen by no one else to remove it)."""
    try:
        (checkpoints / node_mark(token, node_name(os.environ, socket.gethostname()))).unlink(missing_ok=True)
    except OSError:
        pass  # the login node reports what it could not remove where it sees it


def write_facts(out_dir: Path, framework: str | None, checkpoints: Path | None = None, token: str = "") -> Path:
    found = facts(framework, checkpoints, token)
    path = out_dir / f"{FACTS_PREFIX}{found['node']}.json"
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(found))
    os.replace(temporary, path)
    return path


def echo() -> None:
    """One clock reading for each line on stdin."""
    print(ECHO_READY, flush=True)
    for _ in sys.stdin:
        print(repr(time.time()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m injectors.probe")
    sub = parser.add_subparsers(dest="command", required=True)
    facts_parser = sub.add_parser("facts")
    facts_parser.add_argument("--out-dir", type=Path, required=True)
    facts_parser.add_argument("--framework")
    facts_parser.add_argument("--checkpoints", type=Path, help="the spec's checkpoint directory: seen and written here?")
    facts_parser.add_argument("--mark", default="", help="with --checkpoints: the doctor run's token (its files' names)")
    unmark_parser = sub.add_parser("unmark")
    unmark_parser.add_argument("--checkpoints", type=Path, required=True)
    unmark_parser.add_argument("--mark", required=True, help="the doctor run's token")
    sub.add_parser("echo")
    args = parser.parse_args(argv)
    if args.command == "facts":
        if args.checkpoints is not None and not args.mark:
            parser.error("--checkpoints needs --mark (the doctor run's token)")
        write_facts(args.out_dir, args.framework, args.checkpoints, args.mark)
    elif args.command == "unmark":
        unmark(args.checkpoints, args.mark)
    else:
        echo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
