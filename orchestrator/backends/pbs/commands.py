"""The PBS client commands (qsub, qstat -f, qdel, qrerun) through Faultdrill's command wrapper, the
parsing of what they print, and the id rules shared by the submitit plugin and the backend.

Job ids are PBS's own: ``123.server``, an array ``123[].server`` and its element ``123[4].server``.
Slurm's Torque wrappers (slurm-wlm-torque) print bare Slurm ids (``69``); an element is then
``69[4]``, and since their qstat lists each started element under a Slurm id of its own, each
element's batch script records that id in its submitit folder (``<job>_scheduler_id``). Their qstat
prints no exit status either: a finished job is judged by the exit code its batch script recorded
(``<job>_exit_code``), else by what Slurm's accounting under them says (a script the scheduler
killed at its walltime records nothing), else it failed. Light imports only: submitit loads this in every job.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Mapping, Sequence

from experiments.layout import ENV_PBS_SERVER
from orchestrator.commands import CommandError, run_command
from orchestrator.states import PBS_FINISHED_LETTERS, JobState, from_pbs, parse_sacct

ENV_SERVER = ENV_PBS_SERVER  # torque | pro | slurm-wrappers: skips detection
QSTAT_TIMEOUT_S = 20.0
QSUB_TIMEOUT_S = 60.0
SCHEDULER_ID_FILE = "{job}_scheduler_id"
EXIT_CODE_FILE = "{job}_exit_code"
_QSUB_ID = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9_.-]+)?$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.%^+=@/-]+$")  # the wrappers pass -o/-e through a shell
_JOB_LINE = re.compile(r"^Job Id:\s*(\S+)\s*$")
_ATTRIBUTE_LINE = re.compile(r"^([ \t]+)([A-Za-z_][\w.]*) = (.*)$")
# A walltime this close to used up was used up (the MOM kills at the limit or a poll after it, never
# before; the final resources_used.walltime is taken at the job's end, in whole seconds).
WALLTIME_SLACK_S = 5
# Exit codes of qstat/qdel that answer "no such job" (Torque 153, PBS Pro 35): a job that ended.
QSTAT_ANSWERS = (0, 35, 153)
_NO_HISTORY = re.compile(r"job.?history", re.IGNORECASE)  # PBS Pro: job_history_enable is not set
_ELEMENT = re.compile(r"^(\d+)\[\d+\]")
_VNODE_INDEX = re.compile(r"\[\d+\]$")  # PBS Pro: vnode node02[1] is of host node02
_UNKNOWN_JOB = re.compile(r"unknown job id|has finished|job has been deleted", re.IGNORECASE)


class ServerKind(str, Enum):
    TORQUE = "torque"
    PRO = "pro"  # PBS Professional / OpenPBS
    SLURM_WRAPPERS = "slurm-wrappers"  # slurm-wlm-torque over a Slurm cluster

    @property
    def qstat_options(self) -> list[str]:
        """-x (PBS Pro): finished jobs too; -t (Torque, PBS Pro): array subjobs. The wrappers take
        neither (Torque's own -x means XML)."""
        return {"pro": ["-x", "-t"], "torque": ["-t"], "slurm-wrappers": []}[self.value]

    @property
    def qselect_options(self) -> list[str]:
        """-x (PBS Pro): finished jobs too (Torque keeps them listed for keep_completed)."""
        return ["-x"] if self is ServerKind.PRO else []


def detect_server() -> ServerKind:
    """Which PBS the client commands talk to: FAULTDRILL_PBS_SERVER, else probed once per process."""
    override = os.environ.get(ENV_SERVER)
    return ServerKind(override) if override else _probe_server()


@functools.lru_cache(maxsize=1)
def _probe_server() -> ServerKind:
    qstat = shutil.which("qstat")
    if qstat is None:
        raise CommandError(["qstat"], None, "", "qstat is not on PATH", "no PBS client commands")
    try:
        head = Path(qstat).read_bytes()[:8192]
    except OSError:
        head = b""
    if b"use Slurm" in head:
        return ServerKind.SLURM_WRAPPERS
    result = run_command(["qstat", "--version"], timeout_s=QSTAT_TIMEOUT_S, check=False)
    said = (result.stdout + result.stderr).lower()
    if "pbs_version" in said:  # PBS Pro: "pbs_version = 2022.1.1"
        return ServerKind.PRO
    if result.returncode != 0:  # a client that does not run says nothing of its server
        raise CommandError(["qstat", "--version"], result.returncode, result.stdout, result.stderr,
                           "qstat --version failed: which PBS server this is cannot be told")
    return ServerKind.TORQUE  # Torque: "Version: 6.1.3"


# --- ids ---------------------------------------------------------------------------------------


# qsub's words for a limit of queued jobs, which clears as jobs end (PBS Pro's max_queued and
# queued_jobs_threshold: "would exceed ... limit of jobs"; Torque's max_user_queuable and max_queuable:
# "Maximum number of jobs already in queue"), and for a job refused as asked (a queue's or the
# server's resource limits, an unknown queue, a bad resource value, no right to the queue); under
# Slurm's Torque wrappers, sbatch's words (the wrapper prints them on its stdout).
QSUB_LIMIT_MARKERS = ("Maximum number of jobs already in queue", "limit of jobs", "max_user_queuable",
                      "total number of current user's jobs exceeds")
# PBS Pro's max_queued_res ("would exceed ... limit on resource ncpus"): a job's own request may be
# past it for good; a refusal here, with the server's words, never a hold of submit_hold_s.
QSUB_REFUSED_MARKERS = ("Job violates queue and/or server resource limits", "Job exceeds queue resource limits",
                        "limit on resource",
                        "Unknown queue", "Illegal attribute or resource value", "Unauthorized Request",
                        "cannot satisfy queue", "Job rejected by all possible destinations")


def qsub_refusal(error: BaseException) -> tuple[bool, str] | None:
    """qsub's refusal in ``error``: (held, its words) — held for a limit of queued jobs, else
    refused for good — or None if it is no refusal (a timeout, a server that did not answer)."""
    if not isinstance(error, CommandError) or not error.command or error.command[0] != "qsub":
        return None
    if error.returncode is None:  # timed out: it may have taken the job
        return None
    from orchestrator.backends.slurm.backend import SUBMIT_LIMIT_MARKERS, SUBMIT_REFUSED_MARKERS

    lines = [line.strip().strip("'") for line in (error.stderr + "\n" + error.stdout).splitlines()]
    said = [line.removeprefix("qsub: ").removeprefix("sbatch: error: ") for line in lines
            if line and not line.startswith(("There was an error", "The command was", "and the output was", "sbatch "))]
    text = "; ".join(said)
    if any(marker in text for marker in (*QSUB_LIMIT_MARKERS, *SUBMIT_LIMIT_MARKERS)):
        return True, text
    if any(marker in text for marker in (*QSUB_REFUSED_MARKERS, *SUBMIT_REFUSED_MARKERS)):
        return False, text
    return None


def parse_qsub(stdout: str) -> str:
    """qsub prints the new job's id on its last line: ``123.server``, ``123[].server`` or ``69``."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id = lines[-1] if lines else ""
    if not _QSUB_ID.match(job_id):
        raise CommandError(["qsub"], 0, stdout, "", "qsub printed no job id")
    return job_id


def array_element_id(array_id: str, index: int) -> str:
    """``123[].server`` -> ``123[4].server``; a bare wrapper id ``69`` -> ``69[4]``."""
    return array_id.replace("[]", f"[{index}]", 1) if "[]" in array_id else f"{array_id}[{index}]"


def short_id(job_id: str) -> str:
    """The id without its server: ``123[4].server`` -> ``123[4]``."""
    return job_id.split(".", 1)[0]


def is_element(job_id: str) -> bool:
    return bool(re.search(r"\[\d+\]", job_id))


def read_job_file(folder: Path | None, pattern: str, job_id: str) -> str | None:
    if folder is None:
        return None
    try:
        return (Path(folder) / pattern.format(job=job_id)).read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Target:
    """What to name to qstat/qdel for a job; ``array_only``: a wrapper array element that has not
    recorded its own id yet, so only its array (where it is still pending) can be asked about."""

    scheduler_id: str
    array_only: bool = False


def scheduler_target(job_id: str, folder: Path | None, server: ServerKind) -> Target:
    """The job's own id, except for a wrapper array element: the Slurm id it recorded."""
    if server is not ServerKind.SLURM_WRAPPERS or not is_element(job_id):
        return Target(job_id)
    recorded = read_job_file(folder, SCHEDULER_ID_FILE, job_id)
    return Target(recorded) if recorded else Target(job_id.split("[", 1)[0], array_only=True)


def scheduler_id(job_id: str, folder: Path | None, server: ServerKind) -> str:
    return scheduler_target(job_id, folder, server).scheduler_id


def output_options(script_text: str) -> list[str]:
    """The script's ``#PBS -o``/``-e`` as qsub options: the wrappers hand sbatch their own otherwise."""
    options: list[str] = []
    for line in script_text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#PBS" and parts[1] in ("-o", "-e"):
            if not _SAFE_PATH.match(parts[2]):
                raise ValueError(f"output path {parts[2]!r} in '{line}' is not safe to pass to qsub")
            options += parts[1:]
    return options


# --- commands ----------------------------------------------------------------------------------


def qsub(script_name: str, script_text: str, cwd: Path) -> str:
    """Submit ``cwd/script_name`` (a relative name: no user path reaches the wrappers' shell)."""
    result = run_command(["qsub", *output_options(script_text), script_name], cwd=cwd, timeout_s=QSUB_TIMEOUT_S)
    return parse_qsub(result.stdout)


def parse_qstat_full(text: str) -> dict[str, dict[str, str]]:
    """``qstat -f``: ``Job Id: X`` then ``name = value`` lines, indented as the record's first one is
    (four spaces: Torque and PBS Pro, which wrap a long value such as Variable_List onto lines that
    start with a tab; a tab: the Slurm wrappers, which do not wrap). A wrapped line is part of its
    value whatever it holds: a stranger's long value that wraps into ``Job_Owner = <you>`` is not the
    job's owner. The first of an attribute named twice stands."""
    records: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last: str | None = None
    indent: str | None = None
    for line in text.splitlines():
        job = _JOB_LINE.match(line)
        if job:
            current, last, indent = records.setdefault(job.group(1), {}), None, None
            continue
        if current is None:
            continue
        attribute = _ATTRIBUTE_LINE.match(line)
        if attribute and indent is None:
            indent = attribute.group(1)  # the record's own: Job_Name's, the scheduler's to write
        wraps = indent is not None and indent != "\t" and line.startswith("\t")
        if attribute and not wraps and attribute.group(1) == indent:
            last = attribute.group(2)
            current.setdefault(last, attribute.group(3).strip())
        elif wraps and last is not None and line.strip():
            current[last] += line.strip()
    return records


def exec_hosts(record: dict[str, str]) -> list[str]:
    """The hosts a running job holds, in order, each once: from ``exec_host`` (Torque
    ``node01/0-1+node02/0-1``, PBS Pro ``node03/0*2+node04/0*2``, the wrappers ``fd-n1/3+fd-n2/1``),
    else PBS Pro's ``exec_vnode`` (``(node01[0]:ncpus=2)+(node02:ncpus=2+node02[1]:ncpus=1)``: a
    vnode's host is its name without ``[i]``). Empty where the record names neither."""
    if record.get("exec_host"):
        names = [chunk.split("/", 1)[0] for chunk in record["exec_host"].split("+")]
    else:
        chunks = record.get("exec_vnode", "").replace("(", "").replace(")", "").split("+")
        names = [_VNODE_INDEX.sub("", chunk.split(":", 1)[0]) for chunk in chunks]
    return list(dict.fromkeys(name.strip() for name in names if name.strip()))


def qstat_records(ids: Sequence[str], server: ServerKind) -> dict[str, dict[str, str]]:
    """One ``qstat -f`` for all ``ids``; ids the server does not know are simply absent."""
    if not ids:
        return {}
    args = ["qstat", "-f", *server.qstat_options, *ids]
    result = run_command(args, timeout_s=QSTAT_TIMEOUT_S, retries=2, answers=QSTAT_ANSWERS)
    complaints = [line for line in result.stderr.splitlines() if line.strip() and not _UNKNOWN_JOB.search(line)]
    if result.returncode != 0 and complaints:
        raise CommandError(args, result.returncode, result.stdout, result.stderr, "qstat failed")
    return parse_qstat_full(result.stdout)


def record_state(job_id: str, record: dict[str, str] | None, folder: Path | None) -> JobState:
    """A job's state from its qstat record; a finished record without an exit status is judged by
    the exit code the batch script recorded."""
    if record is None:
        return JobState.UNKNOWN
    return _state_of(record, _exit_status(job_id, record, folder))


def _state_of(record: dict[str, str], exit_status: str | None) -> JobState:
    return from_pbs(record.get("job_state", ""), exit_status, walltime_spent=walltime_spent(record))


def walltime_spent(record: dict[str, str]) -> bool:
    """The record shows the job used its whole walltime (``resources_used.walltime`` within
    WALLTIME_SLACK_S of ``Resource_List.walltime``, PBS Pro's and Torque's): a signal that ended it
    then was the walltime's. False where either is missing (the wrappers print neither)."""
    used = _hms_seconds(record.get("resources_used.walltime"))
    limit = _hms_seconds(record.get("Resource_List.walltime"))
    return used is not None and limit is not None and limit > 0 and used >= limit - WALLTIME_SLACK_S


def _hms_seconds(text: str | None) -> int | None:
    """``[[HH:]MM:]SS`` (PBS's durations) in seconds; None for anything else."""
    parts = (text or "").strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds


def _exit_status(job_id: str, record: dict[str, str], folder: Path | None) -> str | None:
    exit_status = record.get("exit_status") or record.get("Exit_status")
    if exit_status is None and record.get("job_state", "")[:1] in PBS_FINISHED_LETTERS:
        exit_status = read_job_file(folder, EXIT_CODE_FILE, job_id)
    return exit_status


def wrapped_slurm_states(scheduler_ids: Sequence[str]) -> dict[str, JobState]:
    """What Slurm under the wrappers says of finished jobs whose qstat record (the wrappers print
    no exit status) cannot: TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL. One sacct call; ids it
    does not know are absent (and stay as qstat says)."""
    if not scheduler_ids:
        return {}
    args = ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(scheduler_ids)]
    result = run_command(args, timeout_s=QSTAT_TIMEOUT_S, retries=1, check=False)
    return parse_sacct(result.stdout) if result.returncode == 0 else {}


def qstat_states(
    job_ids: Sequence[str], folders: Mapping[str, Path], server: ServerKind | None = None
) -> dict[str, JobState]:
    """States of ``job_ids`` from one qstat call; ``folders`` (job id -> submitit folder) lets the
    wrappers' array elements and exit codes be found. Unknown ids are UNKNOWN, never a success."""
    server = server or detect_server()
    targets = {job_id: scheduler_target(job_id, folders.get(job_id), server) for job_id in job_ids}
    records = qstat_records(sorted({target.scheduler_id for target in targets.values()}), server)
    by_short = {short_id(key): record for key, record in records.items()}
    states = {}
    unsaid = {}
    for job_id, target in targets.items():
        record = records.get(target.scheduler_id) or by_short.get(short_id(target.scheduler_id))
        exit_status = _exit_status(job_id, record, folders.get(job_id)) if record is not None else None
        state = _state_of(record, exit_status) if record is not None else JobState.UNKNOWN
        if target.array_only:
            # A wrapper element that has not recorded its own id yet: the array's record says only
            # that something of the array is queued or running.
            state = JobState.PENDING if state in (JobState.PENDING, JobState.RUNNING) else JobState.UNKNOWN
        elif (server is ServerKind.SLURM_WRAPPERS and record is not None and exit_status is None
              and record.get("job_state", "")[:1] in PBS_FINISHED_LETTERS):
            # Finished, and neither the server nor the batch script says how (a script the
            # scheduler killed: at the walltime, on a qdel): Slurm's accounting under them says.
            unsaid[job_id] = target.scheduler_id
        states[job_id] = state
    said = wrapped_slurm_states(sorted(set(unsaid.values())))
    states.update({job_id: said[slurm_id] for job_id, slurm_id in unsaid.items()
                   if said.get(slurm_id, JobState.UNKNOWN) is not JobState.UNKNOWN})
    return states


def qdel(job_id: str, folder: Path | None, server: ServerKind | None = None, force: bool = False) -> None:
    """Delete a job (no error if it already ended); ``force``: purge it even if its node does not
    answer (Torque ``-p``, PBS Pro ``-W force``; the wrappers' qdel has no such option)."""
    server = server or detect_server()
    target = scheduler_target(job_id, folder, server)
    if target.array_only:
        raise CommandError(["qdel", target.scheduler_id], None, "", "", f"{job_id} has not started: under "
                           "Slurm's PBS wrappers qdel can only delete its whole array")
    options = {"torque": ["-p"], "pro": ["-W", "force"]}.get(server.value, []) if force else []
    args = ["qdel", *options, target.scheduler_id]
    # The wrappers' qdel exits 1 in silence for a job that already ended, and prints why otherwise.
    answers = (*QSTAT_ANSWERS, 1) if server is ServerKind.SLURM_WRAPPERS else QSTAT_ANSWERS
    result = run_command(args, timeout_s=QSTAT_TIMEOUT_S, retries=1, answers=answers)
    if result.returncode == 1 and server is ServerKind.SLURM_WRAPPERS and result.stdout.strip():
        raise CommandError(args, 1, result.stdout, result.stderr, "qdel failed")


def qrerun(job_id: str, folder: Path | None, server: ServerKind | None = None) -> None:
    """Put a running job back in the queue (it must be rerunnable: ``-r y``)."""
    run_command(["qrerun", scheduler_id(job_id, folder, server or detect_server())], timeout_s=QSTAT_TIMEOUT_S)


def qselect_named(name: str, user: str, server: ServerKind) -> set[str]:
    """The ids of ``user``'s jobs and arrays named ``name``, selected by the server (Torque and PBS
    Pro; not a qstat -f of every job it holds, with -x its whole history). Torque lists an array's
    elements, never the array: each stands for its array. A PBS Pro server without job history
    refuses -x (exit 0, saying so): asked again without it."""
    args = ["qselect", "-u", user, "-N", name]
    result = run_command([*args, *server.qselect_options], timeout_s=QSTAT_TIMEOUT_S, retries=2)
    if server.qselect_options and _NO_HISTORY.search(result.stderr):
        result = run_command(args, timeout_s=QSTAT_TIMEOUT_S, retries=2)
    return {array_of(job_id) for job_id in result.stdout.split()}


def array_of(job_id: str) -> str:
    """``123[4].server`` -> ``123[].server`` (the array an element is of); any other id as it is."""
    return _ELEMENT.sub(r"\1[]", job_id, count=1)


def qstat_all(server: ServerKind | None = None) -> dict[str, dict[str, str]]:
    """Every job the server lists (finished ones too where it keeps them)."""
    server = server or detect_server()
    args = ["qstat", "-f", *server.qstat_options]
    result = run_command(args, timeout_s=QSTAT_TIMEOUT_S, retries=2, answers=(0, 153))
    return parse_qstat_full(result.stdout)
