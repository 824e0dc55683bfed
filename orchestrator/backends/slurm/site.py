"""What a Slurm site's configuration says (``scontrol show config``): accounting, MaxArraySize; and
the limits it sets on how many jobs one user may have submitted (pending and running alike; an
array's elements each count): MaxSubmitJobs of the user's associations and
MaxSubmitJobsPerUser (``MaxSubmitPU``) of their QOS, enforced only where ``AccountingStorageEnforce``
names ``limits`` (or ``qos``), read from ``sacctmgr``. Unknown (None) where accounting does not
say: submissions past an unread limit are held by the scheduler and tried again (the controller's
held path)."""

from __future__ import annotations

import re

from orchestrator.commands import CommandError, run_command

SACCTMGR_TIMEOUT_S = 20.0
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's own default of MaxArraySize


def accounting_configured(config: str) -> bool:
    """``AccountingStorageType`` of ``scontrol show config`` names a storage: not ``.../none``
    (Slurm < 23.11), ``(null)`` or empty (23.11 removed the none plugin); True when the config is
    unread (its absence is not proof)."""
    value = config_value(config, "AccountingStorageType")
    if value is None:
        return True
    value = value.lower()
    return bool(value) and value != "(null)" and "none" not in value


def config_value(config: str, key: str) -> str | None:
    """``KEY = value`` of ``scontrol show config`` (the value's first word), if it is there."""
    match = re.search(rf"^{re.escape(key)}\s*=[ \t]*(\S*)", config, re.MULTILINE)
    return match.group(1) if match else None


def parse_max_array_size(config: str) -> int:
    """``MaxArraySize = N`` of ``scontrol show config``; Slurm's default when absent or unreadable."""
    value = config_value(config, "MaxArraySize") or ""
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_ARRAY_SIZE


def enforces_limits(config: str) -> bool:
    """``AccountingStorageEnforce`` names ``limits`` or ``qos`` (``safe`` and ``associations``
    alone set no count of jobs)."""
    enforced = (config_value(config, "AccountingStorageEnforce") or "").lower().split(",")
    return "limits" in enforced or "qos" in enforced


def parse_limit_column(text: str) -> list[int]:
    """The numbers of one ``sacctmgr -n -P`` column (an empty field is no limit)."""
    return [int(word) for word in text.split() if word.isdigit()]


def max_submit_jobs(config: str, user: str) -> int | None:
    """The fewest jobs ``user`` may have submitted at once here: the smallest MaxSubmitJobs of
    their associations and MaxSubmitPU of the QOS they may use; None where limits are not enforced,
    none is set, or sacctmgr does not answer."""
    if not enforces_limits(config):
        return None
    found = _column(["show", "assoc", "where", f"user={user}", "format=MaxSubmit"])
    qos_names = {name for line in _lines(["show", "assoc", "where", f"user={user}", "format=QOS"])
                 for name in line.split(",") if name}
    if qos_names:
        found += _column(["show", "qos", "where", f"name={','.join(sorted(qos_names))}", "format=MaxSubmitPU"])
    return min(found) if found else None


def _lines(args: list[str]) -> list[str]:
    try:
        answered = run_command(["sacctmgr", "-n", "-P", *args], timeout_s=SACCTMGR_TIMEOUT_S, check=False)
    except CommandError:
        return []
    return answered.stdout.split() if answered.returncode == 0 else []


def _column(args: list[str]) -> list[int]:
    return parse_limit_column("\n".join(_lines(args)))
