"""What every backend offers the controller: submit, poll in one batched call, cancel, inject."""

from __future__ import annotations

import abc
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from submitit.core import utils as submitit_utils

from experiments.entry import run_rank
from experiments.layout import RankJob
from injectors.actions import WalltimeSet
from orchestrator.at_once import at_once
from orchestrator.backends.daemon_probe import Address, daemons_accept
from orchestrator.campaign.capabilities import BackendCapabilities, Capability
from orchestrator.campaign.runs import RunConfig
from orchestrator.campaign.spec import time_limit_minutes
from orchestrator.commands import CommandError, CommandResult, Conversation, one_line
from orchestrator.render.scripts import SubmissionScript
from orchestrator.states import JobState

MAX_NUM_TIMEOUT = 3  # submitit's default: how often a job that timed out may requeue itself


@dataclass(frozen=True)
class Submission:
    job_id: str
    accepted_at: float  # wall time the scheduler accepted the job (sbatch returned)


@dataclass(frozen=True)
class AttemptRef:
    """An attempt as the ledger knows it, for finding its job when its id was never recorded."""

    run: RunConfig
    attempt: int
    job_name: str | None  # the scheduler's name for it (an array's name for an element)
    array_index: int | None  # its element, if it went out in an array
    submitted: float  # when the controller began submitting it (wall time)


@dataclass(frozen=True)
class SubmitRefusal:
    """The scheduler refused a submission: ``held`` (a limit of submitted jobs: tried again as the
    drill's jobs end, not counted as a failed try) or for good (the run fails at once, saying why)."""

    held: bool
    why: str


class Backend(abc.ABC):
    name: str = ""
    # What it can do (orchestrator/campaign/capabilities.py): callers ask before they call; the
    # actions a backend lacks raise NotSupported with the reason.
    capabilities: ClassVar[BackendCapabilities]
    # The default scheduler poll interval (restart.scheduler_poll_s): a real scheduler is polled
    # at a respectful pace; the local backend's poll costs nothing.
    poll_interval_s: float = 5.0
    # Its commands wait on a scheduler that may take up to their timeouts to answer: the controller
    # runs submissions and cancels off its loop (orchestrator/backends/scheduler_calls.py).
    slow_commands: ClassVar[bool] = True
    # Every moment of its jobs is stamped by this host's clock (the local backend): no clock to read.
    one_clock: ClassVar[bool] = False

    def offers(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def not_supported(self, capability: Capability) -> "NotSupported":
        return NotSupported(self.capabilities.why_not(capability) or f"{capability} is offered")

    @abc.abstractmethod
    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        """Submit one attempt of ``run``; returns once the scheduler has accepted it."""

    def submit_array(self, items: list[tuple[RunConfig, RankJob]], throttle: int | None = None) -> list[Submission]:
        """Submit several runs' attempts together (a job array where the scheduler has them:
        Capability.ARRAYS), at most ``throttle`` running at once (None: the campaign's
        parallel_runs); runs in one call share their resources. Without arrays: one each."""
        return [self.submit(run, job) for run, job in items]

    def max_array_size(self) -> int:
        """The most elements one array may have here (a larger sweep goes out in parts)."""
        return 1 << 31

    def max_submit_jobs(self, qos: str | None = None, queue: str | None = None) -> "SubmitLimit | None":
        """The most jobs this user may have submitted at once here (pending and running; each
        element of an array counts), where the site says (``qos``: the one the jobs ask for;
        ``queue``: their partition or PBS queue); None: no limit known."""
        return None

    @abc.abstractmethod
    def find_submitted(self, ref: AttemptRef) -> list[str]:
        """The jobs of attempt ``ref`` the scheduler accepted although their id was never recorded
        (a controller stopped, or a submission that failed on our side but not the scheduler's),
        oldest first: more than one means duplicates. Raises CommandError if it cannot tell."""

    def submit_refusal(self, error: BaseException) -> "SubmitRefusal | None":
        """What a failed submission's error says of the site's answer, where it is a refusal of the
        job as asked (held: a limit of the jobs one may have submitted, which clears as they end;
        else the job can never be taken as asked), not a failure to reach the scheduler."""
        return None

    def exit_code(self, job_id: str) -> int | None:
        """How an ended job's rank launch exited, where the batch script could not say (the local
        backend has none): 128 + N for a signal N; None if unknown."""
        return None

    def end_time(self, job_id: str) -> float | None:
        """When the scheduler says the job ended (the evidence of a natural failure), if it knows."""
        return None

    @classmethod
    def site_refusals(cls, runs: list[RunConfig]) -> list[str]:
        """What this site cannot do that these runs need (its scheduler's release, ...), one line
        each, said before anything is created or submitted; none by default."""
        return []

    def out_of_memory_steps(self, job_id: str, step_name: str | None = None) -> tuple[str, ...]:
        """The rank steps of an ended job that the scheduler says ran out of memory (asked once for a
        failed attempt's job; ``step_name``: only the steps of that name, an in-allocation attempt's);
        none known by default."""
        return ()

    @classmethod
    def confines_memory(cls, run: RunConfig) -> bool:
        """The scheduler here makes ``run``'s jobs' memory request their memory cgroup's limit (the
        kernel's OOM killer ends what outgrows it): oom-rank then needs no cgroup of its own. Asked
        at plan."""
        return False

    def site_notes(self) -> list[str]:
        """What this site did not give the drill (accounting, ...) and what the drill then knows
        less of: said in the report."""
        return [DAEMONS_SILENT] if getattr(self, "_daemons_silent", False) else []

    def set_patience(self, scheduler_timeout_s: float) -> None:
        """How long the controller waits on the scheduler (restart.scheduler_timeout_s): a backend
        that waits on a part of it (Slurm's accounting) waits less."""
        return None

    def vanished_why(self) -> str:
        """The reason given for a job the scheduler no longer knows."""
        return "job vanished from the scheduler"

    def adopt(self, job_id: str, run: RunConfig, job: RankJob) -> None:
        """Watch a job this controller did not see accepted (an earlier controller's, or one whose
        submission command failed after the scheduler took it). Its submitit pickle is put in
        place if the submission never got that far: the job waits for it, then fails without it."""
        ensure_submitted_pickle(run, self.pickle_id(job_id), job)

    def pickle_id(self, job_id: str) -> str:
        """The id submitit names the job's files by (inside the job, from the scheduler's variables)."""
        return job_id

    @abc.abstractmethod
    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """States of all ``job_ids`` in one batched call; ids the scheduler does not know are UNKNOWN."""

    @abc.abstractmethod
    def cancel(self, job_id: str, force: bool = False) -> None:
        """Ask the scheduler to end the job (no error if it already ended); ``force``: SIGKILL now,
        for a job that a plain cancel did not end. Raises CommandError if the scheduler refuses."""

    @abc.abstractmethod
    def run_agent(self, job_id: str, node: str, argv: list[str], timeout_s: float) -> CommandResult:
        """Run ``python <argv>`` (the fault agent) on ``node`` inside job ``job_id``'s allocation and
        return what it printed; a failure to start it is in the result, not raised."""

    def node_answers(self, job_id: str, node: str, timeout_s: float) -> "NodeAnswer":
        """Does the scheduler still start a step on ``node`` inside job ``job_id``'s allocation (its
        daemon there alive), within ``timeout_s``? The check of a node whose ranks fell silent
        (orchestrator/observe/node_check.py): a bare Python on the node, as the fault agent starts."""
        try:
            result = self.run_agent(job_id, node, ["-S", "-c", "pass"], timeout_s)
        except CommandError as error:
            if error.returncode is None and "timed out" in str(error):
                return NodeAnswer(False, f"no step started on it within {timeout_s:g} s", timed_out=True)
            return NodeAnswer(False, f"the check could not be made ({one_line(error)})")
        if result.returncode == 0:
            return NodeAnswer(True, f"a step on it ran in {result.duration_s:.2f} s", took_s=result.duration_s)
        said = " ".join(result.stderr.split())[-300:]
        # Only a line about this node's daemon (not the controller's, not the job's state) says it is out of reach.
        unreachable = any(node in line and any(sign in line for sign in NODE_DOWN_SAID)
                          for line in result.stderr.splitlines())
        return NodeAnswer(False, f"a step on it failed (exit {result.returncode}: {said})", failed=unreachable)

    def daemon_addresses(self, job_id: str, nodes: list[str]) -> "dict[str, Address | None]":
        """Where each node's scheduler daemon listens (host, port); None where the backend does not
        know (then its node checks prove a node dead only by the scheduler's own word)."""
        return dict.fromkeys(nodes)

    def daemons_accept(self, job_id: str, nodes: list[str], timeout_s: float) -> dict[str, bool | None]:
        """Does each node's scheduler daemon accept a connection within ``timeout_s``? (True: the
        node is up, however slow its steps start; False: it is not; None: nothing proved.)"""
        answers = daemons_accept(self.daemon_addresses(job_id, nodes), timeout_s)
        if True not in answers.values() and False in answers.values():
            self._daemons_silent = True  # said once in the report: a silence is confirmed more slowly here
        return answers

    def talk_on_node(self, job_id: str, node: str, argv: list[str]) -> Conversation:
        """``python <argv>`` on ``node`` inside job ``job_id``'s allocation, as the fault agent runs,
        talked to line by line (a clock's reading: orchestrator.observe.node_clocks)."""
        raise NotSupported(f"the {self.name} backend reaches no node of a job to talk to")

    def agent_job_id(self, job_id: str) -> str:
        """The job's id as its ranks carry it in their environment (what the agent verifies)."""
        return job_id

    # Actions of one capability each (a fault kind's, a strategy's): ask ``offers`` first. --------
    def signal_ranks(self, job_id: str, signal_name: str) -> None:
        """Capability.SIGNAL_RANKS: have the scheduler send ``signal_name`` to every task of the
        job's steps (not the batch script), as its warning does."""
        raise self.not_supported(Capability.SIGNAL_RANKS)

    def requeue(self, job_id: str) -> None:
        """Capability.REQUEUE: have the scheduler run the same job again (restart.strategy requeue)."""
        raise self.not_supported(Capability.REQUEUE)

    def kill_rank_step(self, job_id: str, attempt: int, started_before: int) -> bool:
        """Capability.KILL_RANK_STEP: SIGKILL the ranks' launch of the job (``attempt``'s, not a
        relaunch's: nothing started after ``started_before``, the ``ticks_now()`` of the decision,
        before the next attempt's go) and leave the job (its allocation) running; False if it could
        not be found this time (the caller then kills the verified ranks, or cancels the job)."""
        raise self.not_supported(Capability.KILL_RANK_STEP)

    def set_time_left(self, job_id: str, seconds: float) -> WalltimeSet:
        """Capability.SET_TIME_LEFT: move the job's walltime to about ``seconds`` from now (or, where
        the scheduler moves no running job's walltime, leave it); what was set, in words, and when
        the end is due."""
        raise self.not_supported(Capability.SET_TIME_LEFT)

    def job_nodes(self, job_id: str) -> list[str]:
        """Capability.JOB_NODES: the job's nodes, according to the scheduler, in allocation order."""
        raise self.not_supported(Capability.JOB_NODES)


@dataclass(frozen=True)
class NodeAnswer:
    """A node's answer to its check (Backend.node_answers), in words: a step ran there
    (``answered``); the scheduler could not reach the node to start one (``failed``); none started
    within the timeout (``timed_out``: lost only beside a node that answered); or neither (the
    scheduler refused the step for a reason of its own, the check could not be made): nothing proved."""

    answered: bool
    said: str
    failed: bool = False
    timed_out: bool = False
    took_s: float | None = None  # answered: how long the step took to run


DAEMONS_SILENT = ("node checks: no node's scheduler daemon accepted a connection from this host (a firewall, another "
                  "port): a silent node was found lost only where the scheduler said it could not reach it, not by "
                  "a step that did not start (a crash is then found later, by the scheduler or the hang timeout)")

# What srun says, on a line naming the node, when it could not reach the node's daemon to launch a
# step there ("Task launch for StepId=... failed on node fd-n3: Communication connection failure").
NODE_DOWN_SAID = ("Communication connection failure", "Connection refused", "Connection timed out",
                  "No route to host")


@dataclass(frozen=True)
class SubmitLimit:
    """A site's limit of the jobs one user may have submitted at once, and which setting it is."""

    jobs: int
    source: str  # e.g. "your association's MaxSubmitJobs", "QOS normal's MaxSubmitPU"


class NotSupported(RuntimeError):
    """A scheduler-side action this backend does not offer (the fault is refused, with this)."""


def job_timeout_min(run: RunConfig) -> int:
    """The job's time limit in whole minutes (at least one), as submitit's timeout_min."""
    return max(1, int(time_limit_minutes(run.campaign.resources.time)))


def _dump_call(run: RunConfig, job: RankJob, path: Path) -> None:
    """Pickle the call the job's tasks run (submitit's DelayedSubmission) at ``path``."""
    delayed = submitit_utils.DelayedSubmission(run_rank, job)
    delayed.set_timeout(job_timeout_min(run), MAX_NUM_TIMEOUT)
    delayed.dump(path)


def ensure_submitted_pickle(run: RunConfig, pickle_id: str, job: RankJob) -> None:
    """``<folder>/<id>_submitted.pkl`` (what submitit's job runs), written if it is missing."""
    paths = submitit_utils.JobPaths(run.paths.submitit, job_id=pickle_id)
    if paths.submitted_pickle.exists():
        return
    paths.folder.mkdir(parents=True, exist_ok=True)
    tmp = paths.folder / f".adopt-{uuid.uuid4().hex}.pkl"
    _dump_call(run, job, tmp)
    os.replace(tmp, paths.submitted_pickle)


def dump_pending(run: RunConfig, job: RankJob) -> Path:
    """The pickled call an array element will run, under a temporary name in its run's folder
    (moved to the element's name once the scheduler gave the array its id)."""
    path = run.paths.submitit / f".pending-{uuid.uuid4().hex}.pkl"
    try:
        _dump_call(run, job, path)
    except FileNotFoundError:  # the run's first submission: its folder made now (not a mkdir each time)
        run.paths.submitit.mkdir(parents=True, exist_ok=True)
        _dump_call(run, job, path)
    return path


@dataclass
class PendingArray:
    """An array's batch script under a temporary name and each element's pickled call, until the
    scheduler gives the array its id: then the script and the pickles take the names it implies."""

    runs: list[RunConfig]
    script_path: Path
    pickles: list[Path]

    @classmethod
    def prepare(cls, items: list[tuple[RunConfig, RankJob]], script: SubmissionScript) -> "PendingArray":
        pickles = at_once(lambda item: dump_pending(*item), items)  # thousands of files: side by side
        script.submit_dir.mkdir(parents=True, exist_ok=True)
        script_path = script.submit_dir / f".submission_file_{uuid.uuid4().hex}.sh"
        script_path.write_text(script.text)
        return cls([run for run, _ in items], script_path, pickles)

    def submitted(self, array_id: str, element_id: Callable[[int], str]) -> list[str]:
        """The script renamed as the array's, each pickle as its element's (submitit's job id of
        it); the element ids, in the items' order."""
        self.script_path.rename(self.script_path.with_name(f"{array_id}_submission.sh"))
        elements = [element_id(index) for index in range(len(self.runs))]
        at_once(lambda moved: os.replace(moved[0], _submitted_pickle(moved[1].paths.submitit, moved[2])),
                list(zip(self.pickles, self.runs, elements, strict=True)))
        return elements


def _submitted_pickle(folder: Path, job_id: str) -> Path:
    """Where submitit's runner (and experiments/task.py) looks for a job's pickled call."""
    return submitit_utils.JobPaths(folder, job_id=job_id).submitted_pickle
