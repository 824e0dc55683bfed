"""What a rank died of, kept beside its attempt for the ledger's reason (the rank's own words).

Written by the built-in ranks (experiments/entry.py) and by the rank API on a script's behalf
(experiments/runtime/api.py); read by the controller (orchestrator/observe/watch.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict

from experiments.layout import RankError, RunPaths, write_json_atomic


def record_rank_error(paths: RunPaths, attempt: int, rank: int, error: BaseException) -> None:
    """What this rank died of, for the ledger's reason (best effort: the disk may be what failed)."""
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__
    if cause is not None and str(cause) not in text:
        text += f"; caused by {type(cause).__name__}: {cause}"
    try:
        write_json_atomic(paths.rank_error_file(attempt, rank), asdict(RankError(rank, time.time(), text[:2000])))
    except OSError:
        pass
