"""The rank runtime's side of the faults a rank acts out itself (experiments/runtime/fault_requests):
a request to raise ends the process with the injected error; a signal without a request, or to a
process without the handler, does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from experiments.runtime.fault_requests import ACTION_RAISE, FAULT_SIGNAL

REPO = Path(__file__).resolve().parents[2]
RANK = """
import sys, time
from pathlib import Path
from experiments.runtime.fault_requests import FaultRequests
FaultRequests(Path(sys.argv[1])).install()
print("ready", flush=True)
for line in sys.stdin:  # each line: one "step"; the handler runs between them
    print("stepped", flush=True)
"""


def _rank(request_file: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", RANK, str(request_file)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def _step(process: subprocess.Popen[str]) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("x\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def test_a_request_to_raise_ends_the_rank_with_the_injected_error(tmp_path: Path) -> None:
    request = tmp_path / "rank-1-fault-request.json"
    process = _rank(request)
    os.kill(process.pid, FAULT_SIGNAL)  # no request written: nothing happens
    assert _step(process) == "stepped"
    request.write_text(json.dumps({"action": ACTION_RAISE, "message": "a NaN guard tripped"}))
    os.kill(process.pid, FAULT_SIGNAL)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "InjectedRankError: a NaN guard tripped" in stderr
    assert not request.exists(), "the rank takes (removes) the request it acted on"
