"""What an example script really ran, for the tests to hold a drill's report against: with
``--step-log DIR`` each step appends ``<pid> <step> <time>`` to ``DIR/steps-<rank>.log``
(tests/step_logs.py reads it). The examples import it from beside them; it is not Faultdrill's."""

from __future__ import annotations

import os
import time
from pathlib import Path


class StepLog:
    def __init__(self, directory: Path | None, rank: int = 0) -> None:
        self.file = open(directory / f"steps-{rank}.log", "a") if directory else None  # noqa: SIM115  # open for the run

    def ran(self, step: int, announce: bool = True, pace_s: float = 0.02) -> None:
        """``step`` ran: logged, printed as ``step N`` (the drill's progress line) where ``announce``,
        then ``pace_s`` of sleep (a step of a few milliseconds would end the run before its fault)."""
        if self.file:
            self.file.write(f"{os.getpid()} {step} {time.time():.3f}\n")
            self.file.flush()
        if announce:
            print(f"step {step}", flush=True)
        time.sleep(pace_s)
