"""On-node fault agent: ``python -m injectors.agent KIND --task JSON [--record PATH]``.

On a cluster the login node cannot see compute-node processes, so the controller starts this agent
on the target's node inside the job's own allocation (``srun --overlap``, the PBS route, or a local
process on the local backend). It hands the task to the kind, which verifies its targets and acts,
and prints one JSON line: {"ok": true, ...outcome} or {"ok": false, "error", "gone", "not_reached"}
(an at_step fault's agent that waited its time short of the step: injectors/kinds/moment.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiments.layout import write_json_atomic
from injectors.kinds import REGISTRY, get_kind
from injectors.kinds.base import FaultTask
from injectors.targets import StepNotReached, TargetRefused


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m injectors.agent", description=__doc__)
    parser.add_argument("kind", choices=sorted(REGISTRY), help="the fault kind to act as")
    parser.add_argument("--task", required=True, help="the FaultTask as JSON (run, attempt, job, ranks, options)")
    parser.add_argument("--record", type=Path, help="also write the verdict here (the job may end first)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    task = FaultTask.from_json_dict(json.loads(args.task))
    try:
        if task.kind != args.kind:
            raise ValueError(f"the task is for {task.kind}, the agent was started as {args.kind}")
        outcome = get_kind(args.kind).act_on_node(task)
    except TargetRefused as error:
        _report({"ok": False, "error": str(error), "gone": error.gone,
                 "not_reached": isinstance(error, StepNotReached)}, args.record)
        return 3
    except (ValueError, KeyError) as error:
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
