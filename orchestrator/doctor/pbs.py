"""The PBS site as a drill meets it: the client commands and which server answers them (PBS
Professional/OpenPBS, Torque, or Slurm's Torque wrappers), whether finished jobs are kept (their
ends and walltimes known), and the mpiexec that starts the ranks."""

from __future__ import annotations

import re
import shutil

from orchestrator.backends.pbs.commands import ServerKind, detect_server
from orchestrator.commands import CommandError, run_command
from orchestrator.doctor.checks import Check, failed, passed, warned
from orchestrator.doctor.slurm import accounting_check

COMMANDS = ("qsub", "qstat", "qdel")
SERVER_COMMANDS = ("qselect",)  # PBS Pro's and Torque's own (a submission is found again by name); the wrappers have none
QMGR_TIMEOUT_S = 20.0
# PBS Pro's `qmgr -c "list server"`: `job_history_enable = True`; Torque's: `keep_completed = 300`.
_HISTORY = re.compile(r"^\s*job_history_enable\s*=\s*(\S+)", re.MULTILINE | re.IGNORECASE)
_KEEP_COMPLETED = re.compile(r"^\s*keep_completed\s*=\s*(\d+)", re.MULTILINE | re.IGNORECASE)
# `mpiexec --version`: Open MPI 4 "mpiexec (OpenRTE) 4.1.4", Open MPI 5 "mpiexec (Open MPI) 5.0.3".
_OPEN_MPI = re.compile(r"\((?:open mpi|openrte)\)\s*v?(\d+)\.(\d+)", re.IGNORECASE)
WITHOUT_HISTORY = ("the drill judges a finished job from the run's own files: a walltime's end is not told from a "
                   "failure (TIMEOUT is lost)")


def scheduler_checks() -> list[Check]:
    missing = [command for command in COMMANDS if shutil.which(command) is None]
    if missing:
        return [failed("scheduler", f"not found on this node: {', '.join(missing)}",
                       "run the doctor (and the drill) on a login node of the PBS server, with its commands on PATH")]
    try:
        server = detect_server()
    except CommandError as error:
        return [failed("scheduler", f"qstat does not answer: {error.summary}", "check that qstat works on this node")]
    missing = [command for command in SERVER_COMMANDS if shutil.which(command) is None]
    if server is not ServerKind.SLURM_WRAPPERS and missing:
        return [failed("scheduler", f"{_server_words(server)}, but not found on this node: {', '.join(missing)}",
                       "the drill finds a submission again by its name with qselect: put it on PATH")]
    checks = [passed("scheduler", _server_words(server))]
    if server is ServerKind.SLURM_WRAPPERS:
        checks.append(accounting_check())
    else:
        checks.append(history_check(server, _server_attributes()))
    return [*checks, mpiexec_check(_mpiexec_version())]


def _server_words(server: ServerKind) -> str:
    return {ServerKind.PRO: "PBS Professional / OpenPBS (qstat --version)",
            ServerKind.TORQUE: "Torque",
            ServerKind.SLURM_WRAPPERS: "Slurm's Torque wrappers (qsub, qstat, qdel over a Slurm cluster)"}[server]


def history_check(server: ServerKind, attributes: str | None) -> Check:
    """Whether the server keeps finished jobs, from ``qmgr -c "list server"`` (None: it did not say)."""
    if attributes is None:
        return warned("job history", "qmgr did not list the server's attributes", f"if it keeps no finished jobs, "
                      f"{WITHOUT_HISTORY}")
    if server is ServerKind.PRO:
        match = _HISTORY.search(attributes)
        if match is None or match.group(1).lower() not in ("true", "1"):
            return warned("job history", "job_history_enable is off (PBS Pro's default): finished jobs vanish",
                          f"{WITHOUT_HISTORY}; a manager can set it: qmgr -c 'set server job_history_enable = True'")
        return passed("job history", "job_history_enable = True: finished jobs and their ends stay known")
    match = _KEEP_COMPLETED.search(attributes)
    if match is None or int(match.group(1)) < 60:
        return warned("job history", "keep_completed is unset or under 60 s: finished jobs vanish at once",
                      f"{WITHOUT_HISTORY}; a manager can set it: qmgr -c 'set server keep_completed = 300'")
    return passed("job history", f"keep_completed = {match.group(1)} s: finished jobs stay listed that long")


def _server_attributes() -> str | None:
    try:
        answered = run_command(["qmgr", "-c", "list server"], timeout_s=QMGR_TIMEOUT_S, check=False)
    except CommandError:
        return None
    return answered.stdout if answered.returncode == 0 else None


def mpiexec_check(version: str | None) -> Check:
    """The batch script starts the ranks with Open MPI's mpiexec and Open MPI 4's options
    (--map-by ppr:N:node, -x, --mca); from ``mpiexec --version``'s first line (None: none found)."""
    if version is None:
        return failed("mpiexec", "no mpiexec on this node's PATH",
                      "the PBS batch script starts the ranks with Open MPI's mpiexec: load its module in your "
                      "environment (the job inherits it), or install Open MPI")
    match = _OPEN_MPI.search(version)
    if match is None:
        return warned("mpiexec", f"not Open MPI: {version}",
                      "the batch script passes Open MPI's options (--map-by ppr:N:node, -x NAME, --mca): load an "
                      "Open MPI module, or expect the launch to fail")
    major = int(match.group(1))
    if major != 4:
        return warned("mpiexec", f"Open MPI {match.group(1)}.{match.group(2)}: the batch script's options are Open MPI 4's",
                      "Open MPI 5 takes the session directory as a PRRTE parameter: set workload.mpi: venv in "
                      "the spec (the virtual environment's Open MPI 5, with its options), or load Open MPI 4")
    return passed("mpiexec", f"Open MPI {match.group(1)}.{match.group(2)}")


def _mpiexec_version() -> str | None:
    if shutil.which("mpiexec") is None:
        return None
    try:
        answered = run_command(["mpiexec", "--version"], timeout_s=QMGR_TIMEOUT_S, check=False)
    except CommandError:
        return None
    said = (answered.stdout or answered.stderr).strip()
    return said.splitlines()[0] if said else None
