"""A retired warm spare set's processes are waited for before the next set is fenced and planned
(hardening issue, item 20): the old set's rank 0 may still publish or prune a checkpoint in the
background. Real processes, no framework."""

from __future__ import annotations

import subprocess
import sys

from experiments.warm.processes import retire

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def _started(code: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_retire_returns_once_every_process_has_exited_killing_one_that_ignores_its_stop() -> None:
    polite = _started("import time; print('ready', flush=True); time.sleep(60)")
    stubborn = _started(IGNORES_SIGTERM)
    retire([polite, stubborn], stop=lambda process: process.terminate(), wait_s=1.0)
    assert polite.poll() is not None and stubborn.poll() == -9, (polite.poll(), stubborn.poll())
