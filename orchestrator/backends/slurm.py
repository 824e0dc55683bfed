"""The Slurm backend: a submitit executor whose submission file is Faultdrill's template."""

from __future__ import annotations

import getpass
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.layout import RankJob, read_json_lines
from injectors.kill_rank import FaultOutcome
from injectors.targets import read_identity
from orchestrator.backends.base import Backend, KillRequest, Submission
from orchestrator.commands import CommandError, run_command
from orchestrator.render import SubmissionScript, attempt_job_name, render_slurm
from orchestrator.runs import RunConfig
from orchestrator.states import JobState, from_slurm

SUBMIT_TIMEOUT_S = 60.0
POLL_TIMEOUT_S = 20.0
INJECT_TIMEOUT_S = 60.0


class TemplateSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor, submitting our rendered script through the command wrapper."""

    def __init__(self, folder: Path, script: SubmissionScript, python: str = sys.executable) -> None:
        super().__init__(folder, python=python)
        self.script = script

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
        job_id = parse_sbatch_parsable(result.stdout)
        job: submitit.SlurmJob[Any] = submitit.SlurmJob(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script_path, "submission_file", keep_as_symlink=False)
        return job


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = text.split(";")[0]
    if not job_id.isdigit():
        raise CommandError(["sbatch", "--parsable"], 0, stdout, "", "sbatch printed no job id")
    return job_id


def parse_squeue(stdout: str) -> dict[str, JobState]:
    """Lines of ``squeue -h -o %i|%T``."""
    states: dict[str, JobState] = {}
    for line in stdout.splitlines():
        if "|" in line:
            job_id, raw = line.strip().split("|", 1)
            states[job_id] = from_slurm(raw)
    return states


def parse_sacct(stdout: str) -> dict[str, JobState]:
    """Lines of ``sacct -X -n -P -o JobID,State`` (allocation lines only)."""
    states: dict[str, JobState] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            states[parts[0]] = from_slurm(parts[1])
    return states


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self, drill_id: str, python: str = sys.executable) -> None:
        self.drill_id = drill_id
        self.python = python
        self.user = getpass.getuser()

    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        script = render_slurm(run, job.attempt, self.drill_id, self.python)
        executor = TemplateSlurmExecutor(run.paths.submitit, script, python=self.python)
        resources = run.campaign.resources
        executor.update_parameters(nodes=resources.nodes, ntasks_per_node=resources.tasks_per_node)
        submitted = executor.submit(run_rank, job)
        return Submission(job_id=submitted.job_id, accepted_at=time.time())

    def find_submitted(self, run: RunConfig, attempt: int) -> str | None:
        result = run_command(["squeue", "-h", "-t", "all", "-u", self.user, "-n", attempt_job_name(run, attempt),
                              "-o", "%i"], timeout_s=POLL_TIMEOUT_S, retries=2)
        job_ids = result.stdout.split()
        return job_ids[-1] if job_ids else None

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """One squeue call for every job it still holds; sacct only for ids squeue has forgotten."""
        if not job_ids:
            return {}
        result = run_command(
            ["squeue", "-h", "-t", "all", "-u", self.user, "-o", "%i|%T"], timeout_s=POLL_TIMEOUT_S, retries=2
        )
        states = {job_id: state for job_id, state in parse_squeue(result.stdout).items() if job_id in job_ids}
        missing = [job_id for job_id in job_ids if job_id not in states]
        if missing:
            states.update(self._sacct(missing))
        return {job_id: states.get(job_id, JobState.UNKNOWN) for job_id in job_ids}

    def _sacct(self, job_ids: list[str]) -> dict[str, JobState]:
        try:
            result = run_command(
                ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                timeout_s=POLL_TIMEOUT_S, retries=1,
            )
        except CommandError:
            return {}
        return parse_sacct(result.stdout)

    def cancel(self, job_id: str) -> None:
        run_command(["scancel", job_id], timeout_s=POLL_TIMEOUT_S, retries=1, check=False)

    def kill_rank(self, request: KillRequest) -> FaultOutcome:
        """Launch the fault agent as a step inside the job's allocation, on the target rank's node."""
        paths = request.run.paths
        node = read_identity(paths.root, request.attempt, request.rank).node
        record = paths.attempt_dir(request.attempt) / f"fault-rank{request.rank}-{uuid.uuid4().hex[:8]}.json"
        args = [
            "srun", f"--jobid={request.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--quiet", self.python, "-m", "injectors.agent", "kill-rank",
            "--run-dir", str(paths.root), "--run-id", request.run.run_id, "--attempt", str(request.attempt),
            "--rank", str(request.rank), "--job-id", request.job_id, "--signal", request.signal,
            "--record", str(record),
        ]
        result = run_command(args, timeout_s=INJECT_TIMEOUT_S, check=False)
        return _agent_outcome(result.stdout, record, args, result.returncode, result.stderr)


def _agent_outcome(stdout: str, record: Path, args: list[str], code: int, stderr: str) -> FaultOutcome:
    """The agent's verdict: its record file (written right after it acts) or its stdout line."""
    candidates = read_json_lines(record) if record.exists() else []
    candidates += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    for answer in candidates:
        if answer.get("ok"):
            fields = {key: answer[key] for key in ("kind", "rank", "pid", "node", "signal", "at")}
            return FaultOutcome(**fields)
        raise CommandError(args, code, stdout, answer.get("error", stderr), "fault agent refused")
    raise CommandError(args, code, stdout, stderr, "fault agent gave no answer")
