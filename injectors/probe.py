"""What ``faultdrill doctor`` asks of a compute node, run there as the user's job would run.

``facts --out-dir DIR [--framework F]``: this node's facts as one JSON file in DIR (a folder the
login node reads: on the shared filesystem), named after the node: its host, its clock at the
moment of writing, the Python that runs here and whether it imports the framework, whether this
user may cap a rank's memory (oom-rank). Written atomically (a temporary name, then a rename).

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
import socket
import sys
import time
from pathlib import Path
from typing import Any

from injectors.memory_cgroup import can_cap_memory

FACTS_PREFIX = "facts-"
ECHO_READY = "ready"


LOGIN_MARK = ".faultdrill-doctor-login"  # the login node's file in the checkpoint directory
NODE_MARK_PREFIX = ".faultdrill-doctor-node-"  # each node's


def facts(framework: str | None, checkpoints: Path | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"node": socket.gethostname(), "python": sys.executable,
                             "python_version": platform.python_version(), "uid": os.geteuid(),
                             "memory_cap": can_cap_memory(os.getpid())}
    if checkpoints is not None:
        found["checkpoints"] = checkpoint_facts(checkpoints, found["node"])
    if framework:
        found["framework"] = framework
        try:
            module = importlib.import_module(framework)
            found["framework_version"] = str(getattr(module, "__version__", "?"))
        except Exception as error:  # whatever the import raises is what the drill would meet
            found["framework_error"] = f"{type(error).__name__}: {error}"[:500]
    found["written_at"] = time.time()
    return found


def checkpoint_facts(directory: Path, node: str) -> dict[str, Any]:
    """Whether this node sees the checkpoint directory as the login node does (the file it left
    there) and may write there (a file of this node's, which the login node looks for)."""
    said: dict[str, Any] = {"sees_login_file": (directory / LOGIN_MARK).is_file()}
    try:
        (directory / f"{NODE_MARK_PREFIX}{node}").write_text(str(time.time()))
        said["wrote"] = True
    except OSError as error:
        said["wrote"], said["error"] = False, f"{error.strerror}"
    return said


def write_facts(out_dir: Path, framework: str | None, checkpoints: Path | None = None) -> Path:
    found = facts(framework, checkpoints)
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
    sub.add_parser("echo")
    args = parser.parse_args(argv)
    if args.command == "facts":
        write_facts(args.out_dir, args.framework, args.checkpoints)
    else:
        echo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
