"""The Slurm backend: a submitit executor whose submission file is Faultdrill's template."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.launchers import srun_on_node
from experiments.layout import AGENT_STEP_NAME, RankJob
from experiments.runtime.hostlist import expand_hostlist
from injectors.actions import WalltimeSet
from orchestrator.backends.base import (
    Address,
    AttemptRef,
    Backend,
    PendingArray,
    Submission,
    SubmitLimit,
    SubmitRefusal,
)
from orchestrator.backends.slurm.site import (
    accounting_configured,
    confines_memory,
    container_refusals,
    max_submit_jobs,
    parse_max_array_size,
    show_config,
    slurmd_port,
)
from orchestrator.backends.slurm.version import overlap_refusals
from orchestrator.campaign.capabilities import SLURM
from orchestrator.campaign.directives import cluster_of
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError, CommandResult, Conversation, current_user, run_command
from orchestrator.render.scripts import (
    SubmissionScript,
    array_job_name,
    rank_step_name,
    render_slurm,
    render_slurm_array,
)
from orchestrator.states import JobState, from_slurm, parse_sacct

log = logging.getLogger(__name__)

SUBMIT_TIMEOUT_S = 60.0
POLL_TIMEOUT_S = 20.0
# Said in the report when sacct did not answer (a site without slurmdbd, or with it down): what the
# drill then knows less of.
NO_ACCOUNTING = ("accounting (sacct) did not answer ({why}): a job that left the queue (MinJobAge) ended "
                 "in a state not known, its failure class taken from the run's own files; failure "
                 "times from the poll, not the scheduler's end time; a submission whose answer was "
                 "lost looked for in the queue only")
SACCT_IDS_AT_ONCE = 1000  # job ids in one sacct -j (each ~10 characters: far below MAX_ARG_STRLEN's 128 KiB)
# A poll whose forgotten jobs sacct cannot place fails (the poller asks again) this long before the
# drill goes on without accounting; at once where the site configures none.
ACCOUNTING_GRACE_S = 60.0
_CLUSTER = re.compile(r"^[A-Za-z0-9_.-]+$")


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor, submitting our rendered script through the command wrapper."""

    def __init__(self, folder: Path, script: SubmissionScript, python: str = sys.executable) -> None:
        super().__init__(folder, python=python)
        self.script = script
        self.cluster: str | None = None  # the cluster sbatch sent the job to (--clusters), if any

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self.script.text

    def _submit_command(self, command: str) -> submitit.SlurmJob[Any]:
        folder = submitit_utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        script_path = folder / f".submission_file_{uuid.uuid4().hex}.sh"
        script_path.write_text(self._make_submission_file_text(command, ""))
        result = run_command(
            ["sbatch", "--parsable", str(script_path)], cwd=self.script.submit_dir, timeout_s=SUBMIT_TIMEOUT_S
        )
        # submitit names the job's files by the number alone (the job finds them by SLURM_JOB_ID).
        job_id, self.cluster = split_job_id(parse_sbatch_parsable(result.stdout))
        job: submitit.SlurmJob[Any] = submitit.SlurmJob(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script_path, "submission_file", keep_as_symlink=False)
        return job


# sbatch's words for a limit of submitted jobs (the user's, the account's, the QOS's: Slurm's job
# reasons QOSMaxSubmitJobPerUserLimit, AssocMaxSubmitJobLimit, AssocGrpSubmitJobsLimit, ...; the
# system's MaxJobCount: "Slurm job queue full", then "Unable to create job record"): it clears as
# jobs end.
SUBMIT_LIMIT_MARKERS = ("SubmitJob", "Slurm job queue full", "Unable to create job record")
# What refuses a job as asked, for good: a per-job limit of the QOS or association, an invalid
# QOS, account, partition, time or size.
SUBMIT_REFUSED_MARKERS = ("Job violates accounting/QOS policy", "Invalid qos", "Invalid account",
                          "Invalid partition", "Requested time limit is invalid",
                          "Requested node configuration is not available", "More processors requested than permitted",
                          "Node count specification invalid", "Invalid generic resource",
                          "Invalid node name specified")  # a --nodelist (or the drill's --exclude) of a node now gone


def sbatch_refusal(error: BaseException) -> SubmitRefusal | None:
    """sbatch's refusal in ``error`` (held: a limit of submitted jobs; else for good), if it is one."""
    if not isinstance(error, CommandError) or not error.command or error.command[0] != "sbatch":
        return None
    if error.returncode is None:  # timed out (or not found): what it said is no answer, it may have taken the job
        return None
    said = [line.strip().removeprefix("sbatch: error: ") for line in error.stderr.splitlines() if line.strip()]
    text = "; ".join(said)
    if any(marker in text for marker in SUBMIT_LIMIT_MARKERS):
        return SubmitRefusal(held=True, why=text)
    if any(marker in text for marker in SUBMIT_REFUSED_MARKERS):
        return SubmitRefusal(held=False, why=text)
    return None


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``: Faultdrill's job id is that
    text (the cluster stays with the id, so every later command can name it with ``-M``)."""
    text = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
    job_id, _, cluster = text.partition(";")
    if not job_id.isdigit() or (cluster and not _CLUSTER.match(cluster)):
        raise CommandError(["sbatch", "--parsable"], 0, stdout, "", "sbatch printed no job id")
    return text


def _rank_step(step: str, name: str, wanted: str | None) -> bool:
    """A step of sacct's that ran ranks: not the allocation, its batch or extern step, nor an agent's;
    named ``wanted`` if given."""
    _, dot, suffix = step.partition(".")
    if not dot or suffix in ("batch", "extern") or name == AGENT_STEP_NAME:
        return False
    return wanted is None or name == wanted


def split_job_id(job_id: str) -> tuple[str, str | None]:
    """``123;cluster`` -> (``123``, ``cluster``); ``123`` -> (``123``, None)."""
    number, _, cluster = job_id.partition(";")
    return number, cluster or None


def cluster_args(cluster: str | None) -> list[str]:
    return ["-M", cluster] if cluster else []


def parse_squeue(stdout: str) -> dict[str, JobState]:
    """Lines of ``squeue -h -o %i|%T`` (with -M, ``CLUSTER: name`` lines are skipped)."""
    states: dict[str, JobState] = {}
    for line in stdout.splitlines():
        if "|" in line:
            job_id, raw = line.strip().split("|", 1)
            states[job_id] = from_slurm(raw)
    return states


def parse_slurm_time(text: str) -> float | None:
    """sacct's ``2026-12-01T07:50:01`` (local time) as epoch seconds; None for Unknown/None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class SlurmBackend(Backend):
    name = "slurm"
    capabilities = SLURM

    def __init__(self, drill_id: str, python: str = sys.executable) -> None:
        self.drill_id = drill_id
        self.python = python
        self.user = current_user()
        self._max_array_size: int | None = None
        self._max_submit_jobs: dict[str | None, SubmitLimit | None] = {}  # by QOS, once read
        # Accounting (sacct): why it does not answer now (None: it did last time); why it did not
        # when the drill went on without it (kept: the report says so); since when the poll's
        # lookups have failed (monotonic), and how long the poll waits for it.
        self.accounting_down: str | None = None
        self.accounting_missed: str | None = None
        self._poll_outage_since: float | None = None
        self.accounting_grace_s = ACCOUNTING_GRACE_S
        self._config: str | None = None
        self._daemons: dict[tuple[str | None, str], Address] = {}  # (cluster, node) -> its slurmd

    def site_config(self) -> str:
        """``scontrol show config`` (asked once; "" if it did not answer)."""
        if self._config is None:
            try:
                self._config = run_command(["scontrol", "show", "config"], timeout_s=POLL_TIMEOUT_S, retries=2).stdout
            except CommandError as error:
                log.warning("scontrol show config failed (%s): the site's limits are taken as Slurm's defaults",
                            error.summary)
                self._config = ""
        return self._config

    def max_array_size(self) -> int:
        """The site's MaxArraySize (``scontrol show config``; asked once): an array's indices run
        below it. Slurm's default (1001) if the site does not say."""
        if self._max_array_size is None:
            self._max_array_size = parse_max_array_size(self.site_config())
        return self._max_array_size

    def max_submit_jobs(self, qos: str | None = None, queue: str | None = None) -> SubmitLimit | None:
        """The user's MaxSubmitJobs (association) or MaxSubmitPU (the jobs' QOS) where the site
        enforces limits (``sacctmgr``; asked once)."""
        if qos not in self._max_submit_jobs:
            self._max_submit_jobs[qos] = max_submit_jobs(self.site_config(), self.user, qos)
        return self._max_submit_jobs[qos]

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        script = render_slurm(run, job.attempt, self.drill_id, self.python, exclude_nodes=tuple(job.exclude_nodes))
        executor = TemplateSlurmExecutor(run.paths.submitit, script, python=self.python)
        resources = run.campaign.resources
        executor.update_parameters(nodes=resources.nodes, ntasks_per_node=run.launch_tasks_per_node)
        submitted = executor.submit(run_rank, job)
        return Submission(job_id=_with_cluster(submitted.job_id, executor.cluster), accepted_at=time.time())

    def submit_array(self, items: list[tuple[RunConfig, RankJob]], throttle: int | None = None) -> list[Submission]:
        """The attempts of several runs (same resources) as ONE array (``--array=0-N%P``, P the
        throttle, else the campaign's parallel_runs): element i unpickles items[i]'s job from its own run's folder,
        under submitit's name of the element (``<array>_<i>``), which is also Faultdrill's id of it."""
        if len(items) <= 1:
            return [self.submit(run, job) for run, job in items]
        first = items[0][0]
        name = array_job_name([run for run, _ in items], items[0][1].attempt, self.drill_id)
        script = render_slurm_array([(run, job.attempt) for run, job in items], self.drill_id, name,
                                    throttle or first.campaign.parallel_runs or 1, self.python)  # unsaid: 1 (parallel_runs_of)
        pending = PendingArray.prepare(items, script)
        result = run_command(["sbatch", "--parsable", str(pending.script_path)], cwd=script.submit_dir,
                             timeout_s=SUBMIT_TIMEOUT_S)
        accepted = time.time()
        array_id, cluster = split_job_id(parse_sbatch_parsable(result.stdout))
        elements = pending.submitted(array_id, lambda index: f"{array_id}_{index}")
        return [Submission(job_id=_with_cluster(element, cluster), accepted_at=accepted) for element in elements]

    def pickle_id(self, job_id: str) -> str:
        return split_job_id(job_id)[0]

    def find_submitted(self, ref: AttemptRef) -> list[str]:
        """Jobs named as the attempt (names carry the drill id): squeue for the ones it still holds,
        sacct for those it forgot since (MinJobAge), oldest first."""
        if ref.job_name is None:
            return []
        cluster = cluster_of(ref.run.campaign.resources.extra_directives)
        held = run_command(["squeue", *cluster_args(cluster), "-h", "-t", "all", "-u", self.user,
                            "-n", ref.job_name, "-o", "%i"], timeout_s=POLL_TIMEOUT_S, retries=2)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ref.submitted - 60))
        accounted = self._sacct([*cluster_args(cluster), "-X", "-n", "-P", "-o", "JobID", "-u", self.user,
                                 "--name", ref.job_name, "-S", since], retries=2)
        # squeue -M/sacct -M print the bare number; the id carries the cluster sbatch chose.
        return [_with_cluster(job_id, cluster) for job_id in attempt_jobs(held.stdout, accounted, ref.array_index)]

    def _sacct(self, args: list[str], retries: int = 0, in_poll: bool = False) -> str:
        """sacct's output; "" when accounting does not answer (the queue is then all there is, and
        the report says so). ``in_poll``: the poll's lookup of jobs that left the queue, which raises
        instead while accounting may come back (configured, and down for less than the grace)."""
        try:
            result = run_command(["sacct", *args], timeout_s=POLL_TIMEOUT_S, retries=retries)
        except CommandError as error:
            self.accounting_down = error.summary
            if in_poll:
                if self._poll_outage_since is None:
                    self._poll_outage_since = time.monotonic()
                if not self._past_grace():
                    raise
            if self.accounting_missed is None:
                log.warning("sacct does not answer (%s): the drill goes on without accounting", error.summary)
            self.accounting_missed = error.summary
            return ""
        self.accounting_down = None  # the poll's outage ends only when all its lookups answered (_poll_cluster)
        return result.stdout

    def _past_grace(self) -> bool:
        """Accounting is not to be waited for: the site configures none, or it has been down past the grace."""
        if not accounting_configured(self.site_config()):
            return True
        since = self._poll_outage_since
        return since is not None and time.monotonic() - since >= self.accounting_grace_s

    def set_patience(self, scheduler_timeout_s: float) -> None:
        """The poll waits for accounting at most half the time the controller waits for the scheduler."""
        self.accounting_grace_s = min(ACCOUNTING_GRACE_S, scheduler_timeout_s / 2)

    def vanished_why(self) -> str:
        if self.accounting_down is None:
            return super().vanished_why()
        return "the job left the queue, and accounting (sacct) did not answer to say how it ended"

    @classmethod
    def site_refusals(cls, runs: list[RunConfig]) -> list[str]:
        return overlap_refusals(runs) + container_refusals(runs)

    def out_of_memory_steps(self, job_id: str, step_name: str | None = None) -> tuple[str, ...]:
        """Slurm's task/cgroup says OUT_OF_MEMORY of the step whose task the OOM killer ended, while
        the job is FAILED (its batch script went on): the job's rank steps in accounting (none
        without it), not its batch or extern step nor the steps the drill started in it (agents)."""
        number, cluster = split_job_id(job_id)
        listed = self._sacct([*cluster_args(cluster), "-n", "-P", "-o", "JobID,JobName,State", "-j", number])
        rows = [line.split("|", 2) for line in listed.splitlines() if line.count("|") >= 2]
        return tuple(step for step, name, state in rows
                     if state.startswith(JobState.OUT_OF_MEMORY.value) and _rank_step(step, name, step_name))

    @classmethod
    def confines_memory(cls, run: RunConfig) -> bool:
        return confines_memory(show_config(), run.campaign.resources.extra_directives)

    def submit_refusal(self, error: BaseException) -> SubmitRefusal | None:
        return sbatch_refusal(error)

    def site_notes(self) -> list[str]:
        return super().site_notes() + ([NO_ACCOUNTING.format(why=self.accounting_missed)] if self.accounting_missed else [])

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """One squeue call per cluster for every job it still holds; sacct only for ids squeue has
        forgotten. A failing squeue raises: it says nothing about the jobs. A failing sacct raises
        too while accounting may come back (ACCOUNTING_GRACE_S), then leaves the forgotten ones
        UNKNOWN (they ended; how is not known here)."""
        states: dict[str, JobState] = {}
        for cluster, numbers in _by_cluster(job_ids).items():
            states.update(self._poll_cluster(cluster, numbers))
        return {job_id: states.get(job_id, JobState.UNKNOWN) for job_id in job_ids}

    def _poll_cluster(self, cluster: str | None, numbers: list[str]) -> dict[str, JobState]:
        # No retries here: the controller's poller retries with backoff, the states unknown meanwhile.
        # -r: one line per array element, pending ones too (not 123_[4-9%2]).
        result = run_command(["squeue", *cluster_args(cluster), "-h", "-r", "-t", "all", "-u", self.user,
                              "-o", "%i|%T"], timeout_s=POLL_TIMEOUT_S)
        wanted = set(numbers)  # a sweep's arrays: 10,000 ids, looked up in a set (a list's scan was quadratic)
        states = {number: state for number, state in parse_squeue(result.stdout).items() if number in wanted}
        missing = [number for number in numbers if number not in states]
        # They left the queue: accounting knows how they ended, if the site keeps it (asked in parts:
        # one argument of thousands of ids passes the kernel's limit on an argument's length).
        for start in range(0, len(missing), SACCT_IDS_AT_ONCE):
            part = missing[start:start + SACCT_IDS_AT_ONCE]
            accounted = self._sacct([*cluster_args(cluster), "-X", "-n", "-P", "-o", "JobID,State",
                                     "-j", ",".join(part)], in_poll=True)
            if self.accounting_down is not None:
                break  # past its grace and down: the other parts would wait their timeouts for nothing
            asked = set(part)
            states.update({n: s for n, s in parse_sacct(accounted).items() if n in asked})
        else:
            if missing:  # every part answered: the poll's outage, if any, is over
                self._poll_outage_since = None
        return {_with_cluster(number, cluster): state for number, state in states.items()}

    def end_time(self, job_id: str) -> float | None:
        number, cluster = split_job_id(job_id)
        lines = [line for line in self._sacct([*cluster_args(cluster), "-X", "-n", "-P", "-o", "End", "-j", number],
                                              retries=1).splitlines() if line.strip()]
        return parse_slurm_time(lines[0]) if lines else None

    def cancel(self, job_id: str, force: bool = False) -> None:
        number, cluster = split_job_id(job_id)
        signal = ["-s", "KILL"] if force else []
        run_command(["scancel", *cluster_args(cluster), *signal, number], timeout_s=POLL_TIMEOUT_S, retries=2)

    def run_agent(self, job_id: str, node: str, argv: list[str], timeout_s: float) -> CommandResult:
        """The agent as a step inside the job's allocation, on ``node`` (``srun --overlap``)."""
        number, cluster = split_job_id(job_id)
        number = self._own_number(number, cluster)
        return run_command(srun_on_node(number, node, [self.python, *argv], cluster_args(cluster)),
                           timeout_s=timeout_s, check=False)

    def daemon_addresses(self, job_id: str, nodes: list[str]) -> "dict[str, Address | None]":
        """Each node's slurmd: its NodeAddr (``scontrol show node``, one command for the nodes not
        asked before) at the site's SlurmdPort; None for a node Slurm did not describe."""
        _, cluster = split_job_id(job_id)
        unknown = [node for node in nodes if (cluster, node) not in self._daemons]
        if unknown:
            try:  # a node Slurm does not know fails the command, the others still described
                shown = run_command(["scontrol", *cluster_args(cluster), "-o", "show", "node", ",".join(unknown)],
                                    timeout_s=POLL_TIMEOUT_S, check=False).stdout
            except CommandError as error:
                log.warning("scontrol show node failed (%s): no node's slurmd is asked", error.summary)
                return dict.fromkeys(nodes)
            port = slurmd_port(self.site_config())
            for line in shown.splitlines():
                record = parse_scontrol_record(line)
                if record.get("NodeName"):
                    self._daemons[(cluster, record["NodeName"])] = (record.get("NodeAddr") or record["NodeName"], port)
        return {node: self._daemons.get((cluster, node)) for node in nodes}

    def talk_on_node(self, job_id: str, node: str, argv: list[str]) -> Conversation:
        number, cluster = split_job_id(job_id)
        return Conversation(srun_on_node(self._own_number(number, cluster), node, [self.python, *argv],
                                         cluster_args(cluster)))

    def agent_job_id(self, job_id: str) -> str:
        return split_job_id(job_id)[0]

    def signal_ranks(self, job_id: str, signal_name: str) -> None:
        number, cluster = split_job_id(job_id)
        # Without --full/--batch, scancel signals the job's steps only: the ranks, not the script.
        run_command(["scancel", *cluster_args(cluster), f"--signal={signal_name.removeprefix('SIG')}", number],
                    timeout_s=POLL_TIMEOUT_S, retries=1)

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue``: the job (running, or ended but still known) goes back to the queue;
        Slurm holds it with a BeginTime (the credential lifetime, AuthInfo=cred_expire: 120 s by
        default) before it may start again."""
        number, cluster = split_job_id(job_id)
        run_command(["scontrol", *cluster_args(cluster), "requeue", number], timeout_s=POLL_TIMEOUT_S)

    def kill_rank_step(self, job_id: str, attempt: int, started_before: int) -> bool:
        """The steps named as ``attempt``'s ranks (rank_step_name), each SIGKILLed alone: a signal to
        a step leaves the job running (SIGKILL to the job would cancel it); the next attempt's step,
        which the batch script may be starting already, has a name of its own."""
        number, cluster = split_job_id(job_id)
        listed = run_command(["squeue", *cluster_args(cluster), "-h", "-s", "-j", number, "-o", "%i|%j"],
                             timeout_s=POLL_TIMEOUT_S, retries=1).stdout
        steps = [line.split("|", 1)[0].strip() for line in listed.splitlines()
                 if line.strip().endswith(f"|{rank_step_name(attempt)}")]
        for step in steps:
            run_command(["scancel", *cluster_args(cluster), "--signal=KILL", step], timeout_s=POLL_TIMEOUT_S, retries=1)
        return True

    def set_time_left(self, job_id: str, seconds: float) -> WalltimeSet:
        """Slurm keeps time limits in whole minutes: the new limit is the run time so far plus
        ``seconds``, rounded up to a minute; slurmctld enforces it (and sends the --signal
        warning) at its next periodic check."""
        number, cluster = split_job_id(job_id)
        run_time_s = parse_duration(self._show_job(number, cluster).get("RunTime", ""))
        if run_time_s is None:
            raise CommandError(["scontrol", "show", "job", number], 0, "", "", "no RunTime for the job")
        minutes = max(1, math.ceil((run_time_s + seconds) / 60))
        run_command(["scontrol", *cluster_args(cluster), "update", f"JobId={number}", f"TimeLimit={minutes}"],
                    timeout_s=POLL_TIMEOUT_S, retries=1)
        return WalltimeSet(f"time limit set to {minutes} min (it had run {run_time_s:.0f} s)",
                           ends_within_s=max(seconds, minutes * 60 - run_time_s))

    def job_nodes(self, job_id: str) -> list[str]:
        number, cluster = split_job_id(job_id)
        node_list = self._show_job(number, cluster).get("NodeList", "")
        return expand_hostlist(node_list) if node_list and node_list != "(null)" else []

    def _own_number(self, number: str, cluster: str | None) -> str:
        """An array element's own job number (``srun --jobid`` refuses ``123_4``: measured); a job's is itself."""
        if "_" not in number:
            return number
        own = self._show_job(number, cluster).get("JobId", "")
        if not own.isdigit():
            raise CommandError(["scontrol", "show", "job", number], 0, "", "", "no JobId for the array element")
        return own

    def _show_job(self, number: str, cluster: str | None) -> dict[str, str]:
        result = run_command(["scontrol", *cluster_args(cluster), "show", "job", "-o", number],
                             timeout_s=POLL_TIMEOUT_S, retries=1)
        return parse_scontrol_record(result.stdout)


def parse_scontrol_record(stdout: str) -> dict[str, str]:
    """``scontrol show ... -o``: one line of ``Key=Value`` words (values without spaces)."""
    fields: dict[str, str] = {}
    for word in stdout.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse_duration(text: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) in seconds; None if it is not one."""
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(part) for part in clock.split(":")]
        total_days = int(days) if days else 0
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3:
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return float(seconds + 86400 * total_days)


_JOB_OR_ELEMENT = re.compile(r"^\d+(_\d+)?$")  # 123, or an array element 123_4


def attempt_jobs(squeue_ids: str, sacct_ids: str, array_index: int | None) -> list[str]:
    """The jobs of one attempt, oldest first, from squeue's and sacct's ids of its name. An array
    element's attempt: the element ``array_index`` of each array of that name (squeue lists a
    throttled array's pending elements as one range, ``123_[2-9%2]``). Else: jobs and elements as
    listed, ranges left out (no single job)."""
    listed = {word.strip() for word in (*squeue_ids.split(), *sacct_ids.split())}
    if array_index is not None:
        found = {f"{job_id.split('_', 1)[0]}_{array_index}" for job_id in listed if job_id[:1].isdigit()}
    else:
        found = {job_id for job_id in listed if _JOB_OR_ELEMENT.match(job_id)}
    return sorted(found, key=_id_order)


def _id_order(job_id: str) -> tuple[int, int]:
    number, _, index = job_id.partition("_")
    return int(number), int(index or -1)


def _with_cluster(number: str, cluster: str | None) -> str:
    return f"{number};{cluster}" if cluster else number


def _by_cluster(job_ids: list[str]) -> dict[str | None, list[str]]:
    groups: dict[str | None, list[str]] = {}
    for job_id in job_ids:
        number, cluster = split_job_id(job_id)
        groups.setdefault(cluster, []).append(number)
    return groups
