"""The PBS site as a drill meets it: the client commands and which server answers them (PBS
Professional/OpenPBS, Torque, or Slurm's Torque wrappers), whether finished jobs are kept (their
ends and walltimes known), and the mpiexec that starts the ranks."""

from __future__ import annotations

import re
import shutil

from experiments.launchers import open_mpi_release
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.pbs.commands import ServerKind, detect_server
from orchestrator.backends.pbs.server import QMGR_TIMEOUT_S, job_queue, qmgr_list
from orchestrator.backends.slurm.version import site_version
from orchestrator.commands import CommandError, run_command
from orchestrator.doctor.checks import Check, failed, passed, warned
from orchestrator.doctor.slurm import accounting_check, limits_check

COMMANDS = ("qsub", "qstat", "qdel")
SERVER_COMMANDS = ("qselect",)  # PBS Pro's and Torque's own (a submission is found again by name); the wrappers have none
# PBS Pro's `qmgr -c "list server"`: `job_history_enable = True`; Torque's: `keep_completed = 300`.
_HISTORY = re.compile(r"^\s*job_history_enable\s*=\s*(\S+)", re.MULTILINE | re.IGNORECASE)
_KEEP_COMPLETED = re.compile(r"^\s*keep_completed\s*=\s*(\d+)", re.MULTILINE | re.IGNORECASE)
_VERSION = re.compile(r"^\s*pbs_version\s*=\s*(\S+)", re.MULTILINE | re.IGNORECASE)
LOAD_OPEN_MPI = "load an Open MPI 4 or 5 module in your environment (the job inherits it), or install Open MPI"
WITHOUT_HISTORY = ("the drill judges a finished job from the run's own files: a walltime's end is not told from a "
                   "failure (TIMEOUT is lost)")


def scheduler_checks(queue: str | None = None, parallel_runs: int = 1) -> list[Check]:
    """``queue``: the test job's and the drill's (the spec's partition), else the server's default."""
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
    limits = _limits(queue, parallel_runs)
    if server is ServerKind.SLURM_WRAPPERS:
        return [_wrappers_release(), accounting_check(), limits, mpiexec_check(_mpiexec_version())]
    try:
        status = run_command(["qstat", "-B", "-f"], timeout_s=QMGR_TIMEOUT_S).stdout
    except CommandError as error:
        return [failed("scheduler", f"{_server_words(server)}: the server does not answer: {error.summary}",
                       "check that the PBS server runs and that this node may reach it (qstat -B)")]
    attributes = qmgr_list("server")
    name = job_queue(queue, attributes)
    return [passed("scheduler", f"{_server_words(server)} {server_version(status) or '(release not said)'}"),
            history_check(server, attributes, name, qmgr_list(f"queue {name}") if name else None),
            limits, mpiexec_check(_mpiexec_version())]


def _limits(queue: str | None, parallel_runs: int) -> Check:
    """The user's limit of queued jobs and an array's subjobs, as the drill reads them (the PBS
    backend: the server's and the queue's, or Slurm's under the wrappers)."""
    backend = PBSBackend("doctor")
    return limits_check(f"arrays of at most {backend.max_array_size()} subjobs",
                        backend.max_submit_jobs(None, queue), parallel_runs)


def _server_words(server: ServerKind) -> str:
    return {ServerKind.PRO: "PBS Professional / OpenPBS",
            ServerKind.TORQUE: "Torque",
            ServerKind.SLURM_WRAPPERS: "Slurm's Torque wrappers (qsub, qstat, qdel over a Slurm cluster)"}[server]


def _wrappers_release() -> Check:
    version = site_version()
    said = f"Slurm {version[0]}.{version[1]:02d}" if version else "Slurm's release not said (srun --version)"
    return passed("scheduler", f"{_server_words(ServerKind.SLURM_WRAPPERS)}, {said}")


def server_version(status: str) -> str | None:
    """The server's release from ``qstat -B -f`` (PBS Pro's and Torque's ``pbs_version``)."""
    match = _VERSION.search(status)
    return match.group(1) if match else None


def history_check(server: ServerKind, attributes: str | None, queue: str | None = None,
                  queue_attributes: str | None = None) -> Check:
    """Whether the server keeps finished jobs, from ``qmgr -c "list server"`` (None: it did not
    say); on Torque, ``keep_completed`` may be the job's queue's instead (``list queue``)."""
    if attributes is None:
        return warned("job history", "qmgr did not list the server's attributes", f"if it keeps no finished jobs, "
                      f"{WITHOUT_HISTORY}")
    if server is ServerKind.PRO:
        match = _HISTORY.search(attributes)
        if match is None or match.group(1).lower() not in ("true", "1"):
            return warned("job history", "job_history_enable is off (PBS Pro's default): finished jobs vanish",
                          f"{WITHOUT_HISTORY}; a manager can set it: qmgr -c 'set server job_history_enable = True'")
        return passed("job history", "job_history_enable = True: finished jobs and their ends stay known")
    for where, said in (("the server", attributes), (f"queue {queue}", queue_attributes)):
        seconds = _keep_completed(said)
        if seconds is not None and seconds >= 60:
            return passed("job history", f"keep_completed = {seconds} s on {where}: finished jobs stay listed that long")
    return warned("job history", f"keep_completed is unset or under 60 s on the server and on queue {queue or '?'}: "
                  "finished jobs vanish at once",
                  f"{WITHOUT_HISTORY}; a manager can set it: qmgr -c 'set server keep_completed = 300'")


def _keep_completed(attributes: str | None) -> int | None:
    match = _KEEP_COMPLETED.search(attributes or "")
    return int(match.group(1)) if match else None


def mpiexec_check(version: str | None) -> Check:
    """The batch script starts the ranks with Open MPI's mpiexec and Open MPI 4's options
    (--map-by ppr:N:node, -x, --mca); from ``mpiexec --version``'s first line (None: none found).
    The spec cannot name another MPI on PBS (workload.mpi: site, the site's mpiexec)."""
    if version is None:
        return failed("mpiexec", "no mpiexec on this node's PATH",
                      f"the PBS batch script starts the ranks with Open MPI's mpiexec: {LOAD_OPEN_MPI}")
    found = open_mpi_release(version)
    if found is None:
        return failed("mpiexec", f"not Open MPI: {version}",
                      "the batch script passes Open MPI's options (--map-by ppr:N:node, -x NAME, --mca), which "
                      f"Hydra's mpiexec (MPICH or Intel MPI) refuses: {LOAD_OPEN_MPI}")
    major, release = found[0], f"Open MPI {found[0]}.{found[1]}"
    if major >= 5:
        return passed("mpiexec", f"{release}: the batch script gives its runtime (PRRTE) the session directory as "
                      "a PRRTE parameter (it tells the release when it runs)")
    if major < 4:
        return warned("mpiexec", f"{release}: older than the Open MPI 4 the batch script is written and tested for",
                      f"its options are Open MPI 3's too (--map-by ppr, -x, --mca), but untested there: "
                      f"{LOAD_OPEN_MPI} if a launch fails")
    return passed("mpiexec", release)


def _mpiexec_version() -> str | None:
    if shutil.which("mpiexec") is None:
        return None
    try:
        answered = run_command(["mpiexec", "--version"], timeout_s=QMGR_TIMEOUT_S, check=False)
    except CommandError:
        return None
    said = (answered.stdout or answered.stderr).strip()
    return said.splitlines()[0] if said else None
