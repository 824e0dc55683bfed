"""The Slurm release on this site, and what the drill needs of it.

Every fault that reaches a rank's node goes as a step inside the job (``srun --jobid --overlap``),
and the in-allocation and warm strategies start steps beside a running one (``--overlap``). Slurm
gained ``--overlap`` in 20.11: before it, each of those fails mid-drill with "unrecognized option".
A site that old is told at ``validate``/``plan``, before anything is submitted.
"""

from __future__ import annotations

import functools
import re

from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError, run_command

OVERLAP_SINCE = (20, 11)  # srun --overlap
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of ``srun --version`` ("slurm 22.05.8", "slurm-wlm 22.05.8"); None if unread."""
    match = _VERSION.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@functools.lru_cache(maxsize=1)
def site_version() -> tuple[int, int] | None:
    """This site's Slurm release (asked once a process); None where srun does not answer."""
    try:
        return parse_version(run_command(["srun", "--version"], timeout_s=20.0).stdout)
    except CommandError:
        return None


def overlap_refusals(runs: list[RunConfig]) -> list[str]:
    """The Slurm runs that need ``srun --overlap`` (a fault, a same-job strategy) on a Slurm older
    than 20.11: one line each kind of need, naming the release and what would run."""
    needing = [run for run in runs if run.campaign.backend == "slurm"
               and (run.faults_on_nodes or run.strategy_traits.relaunches_in_job or run.strategy_traits.warm)]
    if not needing:
        return []
    version = site_version()
    if version is None or version >= OVERLAP_SINCE:
        return []
    found = f"{version[0]}.{version[1]:02d}"
    lines = {}
    for run in needing:
        if run.faults_on_nodes:
            lines["faults"] = (f"faults ({', '.join(sorted(set(run.faults_on_nodes)))}): Slurm {found} here has no srun "
                               "--overlap (20.11 and later), which a fault that reaches a rank's node needs (its "
                               "agent is a step inside the job); drill with the faults the controller carries out "
                               "(preempt, timeout, corrupt-checkpoint, ...), or on a newer Slurm")
        if run.strategy_traits.relaunches_in_job or run.strategy_traits.warm:
            lines["strategy"] = (f"restart.strategy {run.campaign.restart.strategy}: Slurm {found} here has no srun "
                                 "--overlap (20.11 and later), which starts its steps beside the running one; "
                                 "use resubmit or requeue")
    return list(lines.values())

