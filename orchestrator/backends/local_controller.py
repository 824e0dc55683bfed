"""The local backend's job: submitit's local controller, which also records how each task ended
(``<folder>/<pid>_exit_codes.json``), as a scheduler's step exit would say: a rank killed by a
signal leaves no result of its own, and only its parent sees the signal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from submitit.local.local import Controller


def exit_codes_file(folder: Path, job_id: str) -> Path:
    return folder / f"{job_id}_exit_codes.json"


class RecordingController(Controller):
    def wait(self, freq: int = 24) -> Sequence[int | None]:
        codes = super().wait(freq)
        path = exit_codes_file(self.folder, str(self.pid))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"exit_codes": list(codes)}))
        os.replace(tmp, path)
        return codes


if __name__ == "__main__":
    assert len(sys.argv) == 2, "usage: python -m orchestrator.backends.local_controller <submitit folder>"
    RecordingController(Path(sys.argv[1])).run()
