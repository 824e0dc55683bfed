"""What a Slurm site's configuration says (``scontrol show config``): accounting, MaxArraySize,
whether a job's memory is confined (task/cgroup); and
the limits it sets on how many jobs one user may have submitted (pending and running alike; an
array's elements each count): MaxSubmitJobs of the user's associations and
MaxSubmitJobsPerUser (``MaxSubmitPU``) of their QOS, enforced only where ``AccountingStorageEnforce``
names ``limits`` (or ``qos``), read from ``sacctmgr``. Unknown (None) where accounting does not
say: submissions past an unread limit are held by the scheduler and tried again (the controller's
held path)."""

from __future__ import annotations

import functools
import re

from orchestrator.backends.base import SubmitLimit
from orchestrator.campaign.directives import parse_directive
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError, run_command

SACCTMGR_TIMEOUT_S = 10.0
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


DEFAULT_SLURMD_PORT = 6818


def slurmd_port(config: str) -> int:
    """``SlurmdPort = N`` of ``scontrol show config``; Slurm's default when absent or unreadable."""
    value = config_value(config, "SlurmdPort") or ""
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else DEFAULT_SLURMD_PORT


def parse_max_array_size(config: str) -> int:
    """``MaxArraySize = N`` of ``scontrol show config``; Slurm's default when absent or unreadable."""
    value = config_value(config, "MaxArraySize") or ""
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_ARRAY_SIZE


def max_job_count(config: str) -> SubmitLimit | None:
    """``MaxJobCount``: the most jobs slurmctld holds at once, every user's together, each element of
    an array counted (an array past it waits in sbatch, then is refused); enforced whether or not
    accounting enforces limits. None where the configuration does not say."""
    value = config_value(config, "MaxJobCount") or ""
    if not value.isdigit() or int(value) < 1:
        return None
    return SubmitLimit(int(value), "the site's MaxJobCount (every user's jobs together)")


def enforces_limits(config: str) -> bool:
    """``AccountingStorageEnforce`` names ``limits`` (or ``safe``, which sets it): Slurm's man page,
    "if you want QOS limits to be enforced you need to use the limits option" (``qos`` and
    ``associations`` alone require a valid QOS or association, and count no jobs)."""
    enforced = (config_value(config, "AccountingStorageEnforce") or "").lower().split(",")
    return "limits" in enforced or "safe" in enforced


def max_submit_jobs(config: str, user: str, qos: str | None = None) -> SubmitLimit | None:
    """The fewest jobs ``user`` may have submitted at once here, and which limit says so: the
    smallest MaxSubmitJobs of their associations, and MaxSubmitPU of the QOS the jobs run under
    (``qos``: the spec's ``--qos``; else the association's default QOS, or its only one), and the
    site's MaxJobCount (every user's jobs: the most the drill's can be). Of the first two, none
    where limits are not enforced, none is set, or sacctmgr does not answer (asked once: a
    sacctmgr that fails is not asked again); None where nothing is known."""
    site_wide = max_job_count(config)
    if not enforces_limits(config):
        return site_wide
    rows = _rows(["show", "assoc", "where", f"user={user}", "format=MaxSubmit,DefaultQOS,QOS"])
    if rows is None:
        return site_wide
    found = [SubmitLimit(int(row[0]), "your association's MaxSubmitJobs") for row in rows if row[0].isdigit()]
    found += [site_wide] if site_wide is not None else []
    chosen = qos or _default_qos(rows)
    if chosen:
        qos_rows = _rows(["show", "qos", "where", f"name={chosen}", "format=MaxSubmitPU"]) or []
        found += [SubmitLimit(int(row[0]), f"QOS {chosen}'s MaxSubmitPU") for row in qos_rows if row[0].isdigit()]
    return min(found, key=lambda limit: limit.jobs) if found else None


def _default_qos(rows: list[list[str]]) -> str | None:
    """The association's DefaultQOS, else its one QOS (several and no default: unknown)."""
    defaults = {row[1] for row in rows if len(row) > 1 and row[1]}
    if len(defaults) == 1:
        return defaults.pop()
    allowed = {name for row in rows if len(row) > 2 for name in row[2].split(",") if name}
    return allowed.pop() if not defaults and len(allowed) == 1 else None


def _rows(args: list[str]) -> list[list[str]] | None:
    """``sacctmgr -n -P ARGS``'s lines, split at ``|``; None if it failed."""
    try:
        answered = run_command(["sacctmgr", "-n", "-P", *args], timeout_s=SACCTMGR_TIMEOUT_S, check=False)
    except CommandError:
        return None
    if answered.returncode != 0:
        return None
    return [line.split("|") for line in answered.stdout.splitlines() if line.strip()]


def confines_memory(config: str, directives: list[str] | None = None) -> bool:
    """A job's memory limit the kernel's OOM killer enforces: Slurm's task/cgroup with
    ``ConstrainRAMSpace=yes`` (on cgroup v1 or v2: ``CgroupPlugin`` ``cgroup/v1``, ``cgroup/v2``
    or ``autodetect``; oom-rank reads either's files), memory a consumable resource
    (``SelectTypeParameters`` ``*_MEMORY``), and a request below the node's memory: the job's own
    (``--mem``, ``--mem-per-cpu``, ``--mem-per-gpu`` in ``directives``) or the site's default
    (DefMemPer*). Slurm then says OUT_OF_MEMORY of the step."""
    plugins = (config_value(config, "TaskPlugin") or "").split(",")
    if "task/cgroup" not in plugins or (config_value(config, "ConstrainRAMSpace") or "").lower() != "yes":
        return False
    cgroup = (config_value(config, "CgroupPlugin") or "autodetect").lower()
    if cgroup not in CGROUP_PLUGINS:
        return False
    if "MEMORY" not in (config_value(config, "SelectTypeParameters") or "").upper():
        return False
    asked = any(parse_directive(text).flag in MEMORY_FLAGS for text in directives or [])
    return asked or any(_set(config_value(config, key)) for key in ("DefMemPerCPU", "DefMemPerNode", "DefMemPerGPU"))


MEMORY_FLAGS = ("--mem", "--mem-per-cpu", "--mem-per-gpu")
CGROUP_PLUGINS = ("cgroup/v1", "cgroup/v2", "autodetect")


def _set(value: str | None) -> bool:
    return value is not None and value.isdigit() and int(value) > 0


@functools.lru_cache(maxsize=1)
def show_config() -> str:
    """``scontrol show config`` for what is decided at plan (asked once a process; "" if it did not
    answer: nothing is then taken as confined or limited)."""
    try:
        return run_command(["scontrol", "show", "config"], timeout_s=20.0, retries=2).stdout
    except CommandError:
        return ""


@functools.lru_cache(maxsize=1)
def srun_help() -> str:
    """``srun --help`` (asked once a process; "" if it did not answer): a SPANK plugin's options are
    listed there (pyxis: ``--container-image``)."""
    try:
        return run_command(["srun", "--help"], timeout_s=20.0).stdout
    except CommandError:
        return ""


def container_refusals(runs: list[RunConfig], help_text: str | None = None) -> list[str]:
    """A spec that names a container (``resources.container``) where srun has no pyxis plugin: the
    ranks' step would fail at once with "unrecognized option"."""
    if not any(run.campaign.resources.container is not None for run in runs):
        return []
    text = srun_help() if help_text is None else help_text
    if "--container-image" in text:
        return []
    return ["resources.container: srun here has no --container-image (the pyxis plugin is not loaded: srun --help "
            "names it where it is); drill without a container, or start apptainer in workload.command"]
