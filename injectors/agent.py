"""On-node fault agent: ``python -m injectors.agent kill-rank ...``.

On a cluster the login node cannot see compute-node processes, so the controller launches this
agent as a step inside the job's own allocation on the target's node (``srun --overlap``). It
verifies the target, acts, and prints one JSON line: {"ok": true, ...outcome} or {"ok": false, "error"}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.layout import write_json_atomic
from injectors.kill_rank import kill_rank
from injectors.targets import TargetRefused


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m injectors.agent")
    sub = parser.add_subparsers(dest="action", required=True)
    kill = sub.add_parser("kill-rank", help="signal one verified rank of the drill's job")
    kill.add_argument("--run-dir", type=Path, required=True)
    kill.add_argument("--run-id", required=True)
    kill.add_argument("--attempt", type=int, required=True)
    kill.add_argument("--rank", type=int, required=True)
    kill.add_argument("--job-id", required=True)
    kill.add_argument("--signal", default="SIGKILL")
    kill.add_argument("--record", type=Path, help="also write the verdict here (the job may end first)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        outcome = kill_rank(args.run_dir, args.run_id, args.attempt, args.rank, args.job_id, args.signal)
    except TargetRefused as error:
        _report({"ok": False, "error": str(error), "gone": error.gone}, args.record)
        return 3
    except ValueError as error:
        _report({"ok": False, "error": str(error), "gone": False}, args.record)
        return 3
    _report({"ok": True, **outcome.to_dict()}, args.record)
    return 0


def _report(verdict: dict[str, object], record: Path | None) -> None:
    if record is not None:
        write_json_atomic(record, verdict)
    print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    sys.exit(main())
