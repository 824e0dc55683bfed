"""A service that starts training processes outside the rank's process tree, as a container
runtime's daemon or a site's job service would: the wrapper a drill test runs as its rank asks it
for a trainer (a request file in its spool), shows the trainer's log as its own output, and ends
when the trainer ends. A fault that signals the rank's processes never reaches that trainer: the
drill must say so (orchestrator/record/effects.py). The test that starts the service stops it, and
the service ends every process it started (its own children) as it stops.

    python tests/trainer_service.py SPOOL    # until SIGTERM
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.05


def serve(spool: Path) -> None:
    started: list[subprocess.Popen[bytes]] = []
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.is_set():
            for request in sorted(spool.glob("*.json")):
                started.append(_start(request))
            time.sleep(POLL_S)
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _start(request: Path) -> subprocess.Popen[bytes]:
    asked = json.loads(request.read_text())
    request.unlink()
    with open(asked["log"], "ab") as log:
        process = subprocess.Popen(asked["argv"], cwd=asked["cwd"], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    stem = asked["log"].removesuffix(".log")
    Path(f"{stem}.pid").write_text(str(process.pid))
    threading.Thread(target=lambda: Path(f"{stem}.rc").write_text(str(process.wait())), daemon=True).start()
    return process


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
