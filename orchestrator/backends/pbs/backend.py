"""The PBS backend: Faultdrill's template submitted by the submitit PBS plugin (qsub), all jobs
polled with one ``qstat -f``, ``qdel`` to cancel, and the fault agent started
on the target rank's node.

Reaching a rank's node. PBS offers no command that starts a process inside a running job from the
login node (``pbsdsh`` and ``pbs_attach`` work only from within the job), so on a real PBS server the
agent goes over ``ssh`` to the node, which PBS sites allow for nodes where the user has a running
job. Under Slurm's Torque wrappers the job is a Slurm job and ssh is no option, so the agent runs
as a step of it on that node (``srun --jobid --overlap``), as the Slurm backend does.
FAULTDRILL_PBS_AGENT_LAUNCH=ssh|srun overrides the choice.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

from experiments.entry import run_rank
from experiments.launchers import srun_on_node
from experiments.layout import ENV_PBS_AGENT_LAUNCH, RankJob
from injectors.actions import WalltimeSet
from orchestrator.backends.base import (
    MAX_NUM_TIMEOUT,
    Address,
    AttemptRef,
    Backend,
    NotSupported,
    PendingArray,
    Submission,
    SubmitLimit,
    SubmitRefusal,
    job_timeout_min,
)
from orchestrator.backends.pbs.commands import (
    QSTAT_TIMEOUT_S,
    ServerKind,
    array_element_id,
    detect_server,
    qdel,
    qselect_named,
    qstat_records,
    qstat_states,
    qsub,
    qsub_refusal,
    scheduler_id,
)
from orchestrator.backends.pbs.plugin import PBSExecutor
from orchestrator.backends.pbs.server import max_array_size, max_queued, qmgr_list
from orchestrator.backends.slurm.backend import SlurmBackend
from orchestrator.campaign.capabilities import PBS
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import time_limit_minutes
from orchestrator.commands import CommandError, CommandResult, Conversation, current_user, run_command
from orchestrator.render.scripts import SubmissionScript, array_job_name, render_pbs, render_pbs_array
from orchestrator.states import JobState

ENV_AGENT_LAUNCH = ENV_PBS_AGENT_LAUNCH  # auto | ssh | srun
PBS_MOM_PORT = 15002  # pbs_mom's service port unless the site says otherwise


class TemplatePBSExecutor(PBSExecutor):
    """The plugin's executor, submitting a script Faultdrill rendered."""

    def __init__(self, folder: Path, script: SubmissionScript, python: str = sys.executable) -> None:
        super().__init__(folder, max_num_timeout=MAX_NUM_TIMEOUT, python=python)
        self.script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self.script.text


class PBSBackend(Backend):
    name = "pbs"
    capabilities = PBS

    def __init__(self, drill_id: str, python: str = sys.executable) -> None:
        self.drill_id = drill_id
        self.python = python
        self._folders: dict[str, Path] = {}  # job id -> its submitit folder (where its records are)
        self.user = current_user()
        self._max_submit_jobs: dict[str | None, SubmitLimit | None] = {}  # by queue, once read
        self._max_array_size: int | None = None
        self._slurm_site: SlurmBackend | None = None

    def max_submit_jobs(self, qos: str | None = None, queue: str | None = None) -> SubmitLimit | None:
        """The user's limit of queued jobs: the server's and the job's queue's (``max_queued``,
        ``max_user_queuable``; qmgr, asked once); under Slurm's Torque wrappers, Slurm's own (the
        jobs are Slurm's)."""
        if detect_server() is ServerKind.SLURM_WRAPPERS:
            return self._slurm().max_submit_jobs(qos)
        if queue not in self._max_submit_jobs:
            self._max_submit_jobs[queue] = max_queued(self.user, queue)
        return self._max_submit_jobs[queue]

    def max_array_size(self) -> int:
        """The most subjobs one array may have: the server's ``max_array_size`` (PBS Pro) or
        ``max_job_array_size`` (Torque); Slurm's MaxArraySize under the wrappers; asked once."""
        if detect_server() is ServerKind.SLURM_WRAPPERS:
            return self._slurm().max_array_size()
        if self._max_array_size is None:
            self._max_array_size = max_array_size(qmgr_list("server"))
        return self._max_array_size

    def _slurm(self) -> SlurmBackend:
        """Slurm itself, under its Torque wrappers: the site's limits are its own (read once, by it)."""
        if self._slurm_site is None:
            self._slurm_site = SlurmBackend(self.drill_id, self.python)
        return self._slurm_site

    def submit_refusal(self, error: BaseException) -> SubmitRefusal | None:
        found = qsub_refusal(error)
        return SubmitRefusal(held=found[0], why=found[1]) if found is not None else None

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        script = render_pbs(run, job.attempt, self.drill_id, self.python)
        executor = TemplatePBSExecutor(run.paths.submitit, script, self.python)
        resources = run.campaign.resources
        executor.update_parameters(nodes=resources.nodes, tasks_per_node=run.launch_tasks_per_node,
                                   timeout_min=job_timeout_min(run))
        submitted = executor.submit(run_rank, job)
        self._folders[submitted.job_id] = run.paths.submitit
        return Submission(job_id=submitted.job_id, accepted_at=time.time())

    def submit_array(self, items: list[tuple[RunConfig, RankJob]], throttle: int | None = None) -> list[Submission]:
        """The attempts of several runs (same resources) as ONE array job, throttled to
        ``throttle`` (else the campaign's parallel_runs): element i unpickles items[i]'s job from its own run's folder."""
        if len(items) <= 1:
            return [self.submit(run, job) for run, job in items]
        first = items[0][0]
        name = array_job_name([run for run, _ in items], items[0][1].attempt, self.drill_id)
        script = render_pbs_array([(run, job.attempt) for run, job in items], self.drill_id, name,
                                  throttle or first.campaign.parallel_runs or 1, self.python)  # unsaid: 1 (parallel_runs_of)
        pending = PendingArray.prepare(items, script)
        array_id = qsub(pending.script_path.name, script.text, script.submit_dir)
        accepted = time.time()
        elements = pending.submitted(array_id, lambda index: array_element_id(array_id, index))
        for (run, _), job_id in zip(items, elements, strict=False):
            self._folders[job_id] = run.paths.submitit
        return [Submission(job_id=job_id, accepted_at=accepted) for job_id in elements]

    def find_submitted(self, ref: AttemptRef) -> list[str]:
        """Jobs named as the attempt, or the element of the array it went out in, oldest first."""
        if ref.job_name is None:
            return []
        ordered = sorted(self._named(ref.job_name), key=lambda job_id: int(re.match(r"\d*", job_id).group() or 0))  # type: ignore[union-attr]  # \d* matches every string
        if ref.array_index is not None:
            ordered = [array_element_id(job_id, ref.array_index) for job_id in ordered]
        for job_id in ordered:
            self._folders.setdefault(job_id, ref.run.paths.submitit)
        return ordered

    def _named(self, name: str) -> set[str]:
        """The ids qsub gave the jobs (arrays) of this name. Under Slurm's wrappers qstat lists each
        started array element under a Slurm id of its own, with the same name and nothing to tell
        it from the array: Slurm itself names the array (%F: the array's id, a job's own otherwise)."""
        user = current_user()  # job names are public: only this user's jobs are the drill's
        if detect_server() is ServerKind.SLURM_WRAPPERS:
            result = run_command(["squeue", "-h", "-t", "all", "-u", user, "-n", name, "-o", "%F"],
                                 timeout_s=QSTAT_TIMEOUT_S, retries=2)
            return set(result.stdout.split())
        return qselect_named(name, user, detect_server())

    def adopt(self, job_id: str, run: RunConfig, job: RankJob) -> None:
        super().adopt(job_id, run, job)
        self._folders.setdefault(job_id, run.paths.submitit)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """One qstat -f for all ids (raises CommandError when qstat itself fails)."""
        return qstat_states(job_ids, self._folders) if job_ids else {}

    def cancel(self, job_id: str, force: bool = False) -> None:
        qdel(job_id, self._folders.get(job_id), force=force)

    def set_time_left(self, job_id: str, seconds: float) -> WalltimeSet:
        """PBS moves no running job's walltime (``qalter -l walltime`` is for queued jobs, and the
        wrappers' qalter takes no ``-l``): the job keeps the walltime its spec gave, and its end is
        due within that walltime."""
        server = detect_server()
        target = scheduler_id(job_id, self._folders.get(job_id), server)
        try:
            records = qstat_records([target], server)
        except CommandError as error:
            raise NotSupported(f"qstat -f {target} failed: {error}") from None
        walltime = next(iter(records.values()), {}).get("Resource_List.walltime", "")
        if not walltime:
            raise NotSupported(f"qstat -f {target} shows no Resource_List.walltime")
        return WalltimeSet(f"walltime kept at {walltime} (PBS moves no running job's walltime)",
                           ends_within_s=time_limit_minutes(walltime) * 60)

    def run_agent(self, job_id: str, node: str, argv: list[str], timeout_s: float) -> CommandResult:
        """The agent on ``node``: a step of the job under the wrappers, else over ssh (see the module doc)."""
        return run_command(self._on_node(job_id, node, [self.python, *argv]), timeout_s=timeout_s, check=False)

    def talk_on_node(self, job_id: str, node: str, argv: list[str]) -> Conversation:
        return Conversation(self._on_node(job_id, node, [self.python, *argv]))

    def daemon_addresses(self, job_id: str, nodes: list[str]) -> "dict[str, Address | None]":
        """Each node's execution daemon: slurmd under Slurm's PBS wrappers (Slurm's word for where it
        listens), else pbs_mom at its service port (PBS_MOM_SERVICE_PORT, 15002 by default)."""
        if detect_server() is ServerKind.SLURM_WRAPPERS:
            return self._slurm().daemon_addresses("", nodes)  # the wrappers' own cluster
        said = os.environ.get("PBS_MOM_SERVICE_PORT", "")
        port = int(said) if said.isdigit() else PBS_MOM_PORT
        return {node: (node, port) for node in nodes}

    def _on_node(self, job_id: str, node: str, agent: list[str]) -> list[str]:
        launch = os.environ.get(ENV_AGENT_LAUNCH, "auto")
        server = detect_server()
        if launch == "srun" or (launch == "auto" and server is ServerKind.SLURM_WRAPPERS):
            slurm_id = scheduler_id(job_id, self._folders.get(job_id), server)
            return srun_on_node(slurm_id, node, agent)
        if launch in ("auto", "ssh"):
            return ["ssh", "-o", "BatchMode=yes", node, shlex.join(agent)]
        raise ValueError(f"{ENV_AGENT_LAUNCH}={launch!r}: valid are auto, ssh and srun")


