"""The Slurm site as a drill meets it: its commands and release, accounting, the limits that shape
a sweep, and whether a preempted job may be requeued."""

from __future__ import annotations

import shutil

from orchestrator.backends.base import SubmitLimit
from orchestrator.backends.slurm.backend import SlurmBackend
from orchestrator.backends.slurm.site import accounting_configured, config_value, max_submit_jobs, srun_help
from orchestrator.backends.slurm.version import OVERLAP_SINCE, site_version
from orchestrator.campaign.directives import qos_of
from orchestrator.commands import CommandError, current_user, run_command
from orchestrator.doctor.checks import Check, failed, passed, warned

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "srun", "sacct")
LIMIT_KEYS = ("MaxArraySize", "MaxJobCount", "MinJobAge")
SACCT_TIMEOUT_S = 20.0


def scheduler_checks(parallel_runs: int, extra_directives: tuple[str, ...] = (),
                     container: str | None = None) -> list[Check]:
    missing = [command for command in COMMANDS if shutil.which(command) is None]
    if missing:
        return [failed("scheduler", f"not found on this node: {', '.join(missing)}",
                       "run the doctor (and the drill) on a login node of the cluster, with Slurm's commands on PATH")]
    config = SlurmBackend("doctor").site_config()
    return [_release(), _accounting(config), _limits(config, parallel_runs, qos_of(list(extra_directives))),
            _requeue(config), *([container_check(container, srun_help())] if container is not None else [])]


def container_check(image: str, help_text: str) -> Check:
    """The spec's container needs Slurm's pyxis plugin (``srun --container-image``)."""
    if "--container-image" not in help_text:
        return failed("container", f"{image}: srun here has no --container-image (no pyxis plugin)",
                      "drill without resources.container, or start apptainer in workload.command")
    return passed("container", f"{image}: srun --container-image (pyxis); the rank runtime runs inside: the image "
                  "needs Faultdrill's Python release")


def _release() -> Check:
    version = site_version()
    if version is None:
        return warned("scheduler", "srun --version did not answer", "check that srun works on this node")
    found = f"Slurm {version[0]}.{version[1]:02d}"
    if version < OVERLAP_SINCE:
        return failed("scheduler", f"{found}: no srun --overlap (20.11 and later)",
                      "faults and the in-allocation and warm strategies need it: drill on a newer Slurm, "
                      "or without faults and with restart.strategy resubmit or requeue")
    return passed("scheduler", f"{found}: srun --overlap")


def accounting_check() -> Check:
    """Slurm's accounting alone (the PBS doctor under Slurm's Torque wrappers asks it)."""
    return _accounting(SlurmBackend("doctor").site_config())


def _accounting(config: str) -> Check:
    without = ("the drill works without it: states from squeue and the run's own files; a job that left "
               "squeue ended in a state the report calls unknown")
    if not accounting_configured(config):
        return warned("accounting", "no accounting storage (sacct has nothing)", without)
    try:
        answered = run_command(["sacct", "-n", "-X", "-S", "now-1minutes", "-o", "JobID"], timeout_s=SACCT_TIMEOUT_S,
                               check=False)
    except CommandError as error:  # it did not answer in time (slurmdbd configured, not reachable)
        return warned("accounting", f"sacct did not answer: {error.summary}", without)
    if answered.returncode != 0:
        return warned("accounting", f"sacct failed: {answered.stderr.strip()[:200]}", without)
    return passed("accounting", "sacct answers")


def _limits(config: str, parallel_runs: int, qos: str | None) -> Check:
    found = {key: config_value(config, key) for key in LIMIT_KEYS}
    said = ", ".join(f"{key} {value}" for key, value in found.items() if value)
    return limits_check(said, max_submit_jobs(config, current_user(), qos), parallel_runs)


def limits_check(said: str, limit: SubmitLimit | None, parallel_runs: int) -> Check:
    """The site's limits in words (``said``) and the user's limit of submitted jobs against the
    spec's parallel_runs (the PBS doctor's too)."""
    if limit is None:
        return passed("limits", said or "none said")
    if limit.jobs < 1:
        return failed("limits", f"{said}; {limit.source} {limit.jobs}: you may submit no job",
                      "ask for a limit, or use another account or QOS (resources.extra_directives)")
    if limit.jobs < parallel_runs:
        return warned("limits", f"{said}; {limit.source} {limit.jobs} < parallel_runs {parallel_runs}",
                      f"the drill keeps at most {limit.jobs} runs in flight (arrays of at most {limit.jobs} runs in "
                      "all); lower parallel_runs to match, or ask for a larger limit")
    return passed("limits", f"{said}; {limit.source} {limit.jobs}")


def _requeue(config: str) -> Check:
    if config_value(config, "JobRequeue") == "0":
        return warned("requeue", "JobRequeue = 0: jobs are not requeued unless they ask (--requeue)",
                      "restart.strategy requeue and preempt's then: requeue submit with --requeue, as they do")
    return passed("requeue", "a job may be requeued (restart.strategy requeue, preempt then: requeue)")
