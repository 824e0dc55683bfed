"""A campaign's workdir: start fresh, resume an interrupted drill, or archive a finished one."""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.campaign.spec import Campaign, SpecError
from orchestrator.faults.job_control import MENDS_NAME
from orchestrator.record.ledger import LEDGER_NAME, Ledger


def prepare_workdir(campaign: Campaign) -> Path | None:
    """Archive a finished drill found in the workdir (renamed, never deleted); return where it went.
    What it still owes (orchestrator.faults.job_control: a mend that failed) stays in the workdir.

    An unfinished drill is resumed by the controller, but only with the spec it was started with.
    """
    ledger_path = campaign.workdir / LEDGER_NAME
    if not ledger_path.exists():
        return None
    ledger = Ledger(ledger_path)
    try:
        finished = ledger.meta("finished")
        started_with = ledger.meta("spec")
    finally:
        ledger.close()
    if finished is None:
        if started_with is not None and started_with != campaign.model_dump(mode="json"):
            raise SpecError(
                f"workdir {campaign.workdir} holds an unfinished drill started with another spec; "
                "use another workdir, or finish that drill with the spec it was started with"
            )
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(float(finished)))
    archive = campaign.workdir.with_name(f"{campaign.workdir.name}.{stamp}")
    suffix = 1
    while archive.exists():
        archive = campaign.workdir.with_name(f"{campaign.workdir.name}.{stamp}-{suffix}")
        suffix += 1
    campaign.workdir.rename(archive)
    owed = archive / MENDS_NAME
    if owed.exists():  # actions the finished drill still owes (a failed mend): its successor tries them first
        campaign.workdir.mkdir(parents=True)
        os.replace(owed, campaign.workdir / MENDS_NAME)
    return archive
