"""Carrying out one planned fault: a kind that acts on ranks is run by the fault agent on each target
rank's node, inside the job's allocation (the backend knows how to get there); a kind that acts on
shared files, the scheduler or the cluster acts from here. Backends know no fault kind."""

from __future__ import annotations

import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from injectors.kinds import get_kind
from injectors.kinds.base import FaultOutcome, FaultTask, Site
from injectors.schedule import PlannedFault
from injectors.targets import StepNotReached, TargetRefused, read_identity
from orchestrator.campaign.runs import RunConfig
from orchestrator.commands import CommandError, CommandResult
from orchestrator.faults.job_control import BackendJobControl, Menders
from orchestrator.record.clocks import load_clocks
from orchestrator.states import JobState

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

AGENT_TIMEOUT_S = 60.0  # beyond what the kind itself takes (a stall's duration)
TOGETHER_S = 2.0  # agents on several nodes are told to act this long after they are launched (srun takes ~1 s)
# An at_step fault's agent, started ahead of its step, waits this long for it on the node before it
# answers "not reached" (the controller starts it again nearer the step): a controller that stops
# meanwhile leaves an agent that may still act this long (its row says unknown).
STEP_WAIT_S = 30.0
# The launcher could not start the agent because the job is ending: the fault came too late.
_JOB_ENDED = re.compile(r"already completing or completed|Invalid job id|Job has expired", re.IGNORECASE)


@dataclass(frozen=True)
class FaultRequest:
    run: RunConfig
    attempt: int
    job_id: str
    fault: PlannedFault
    on_acted: Callable[[float, str], None] = lambda at, node: None  # a node fault broke its node
    # The job's state as the controller last polled it (None: not watched now): see BackendJobControl.
    known_state: Callable[[], JobState | None] = lambda: None


def inject(backend: "Backend", request: FaultRequest) -> FaultOutcome:
    """Act out ``request.fault``; raises TargetRefused (with ``gone`` if the target had ended)."""
    kind = get_kind(request.fault.kind)
    task = _task(backend, request)
    if kind.site is Site.CONTROLLER:
        control = BackendJobControl(backend, request.job_id,
                                    signal_by_agent=lambda name: _signal_every_rank(backend, request, task, name),
                                    menders=Menders(request.run.campaign.workdir), on_acted=request.on_acted,
                                    fence=(request.run.paths, request.attempt), known_state=request.known_state)
        return kind.act_on_controller(task, control)
    return _on_rank_nodes(backend, request, task)


def _signal_every_rank(backend: "Backend", request: FaultRequest, task: FaultTask, signal_name: str) -> None:
    """The scheduler's warning, where the scheduler cannot send it: the agent signals every rank."""
    _on_rank_nodes(backend, request, FaultTask(**{**task.__dict__, "kind": "kill-rank",
                                                  "ranks": tuple(range(request.run.ranks)),
                                                  "options": {"signal": signal_name}}))


def kill_every_rank(backend: "Backend", run: RunConfig, attempt: int, job_id: str) -> FaultOutcome:
    """SIGKILL every rank of ``attempt`` through the agent (each verified first): ends a rank launch
    the scheduler cannot kill alone (a hang under in-allocation on PBS), the job goes on. Ranks
    that never registered (a stuck start) are left to the launcher, which ends them with the others."""
    ranks = tuple(rank for rank in range(run.ranks) if run.paths.rank_file(attempt, rank).exists())
    if not ranks:  # the batch script ends the launcher itself on the controller's go
        raise TargetRefused(f"no rank of attempt {attempt} has registered: nothing to kill", gone=True)
    fault = PlannedFault(index=-1, kind="kill-rank", delay_s=0.0, anchor="training_start", ranks=ranks,
                         options={"signal": "SIGKILL"})
    request = FaultRequest(run=run, attempt=attempt, job_id=job_id, fault=fault)
    return _on_rank_nodes(backend, request, _task(backend, request))


def _task(backend: "Backend", request: FaultRequest) -> FaultTask:
    """What the kind acts on: the request's run, attempt, job (as the agent names it), ranks, options."""
    at_step = request.fault.at_step
    clocks = load_clocks(request.run.paths.clocks_file(request.attempt))
    return FaultTask(kind=request.fault.kind, run_dir=request.run.paths.root, run_id=request.run.run_id,
                     attempt=request.attempt, job_id=backend.agent_job_id(request.job_id),
                     ranks=request.fault.ranks, options=dict(request.fault.options),
                     at_step=at_step, wait_s=STEP_WAIT_S if at_step is not None else 0.0,
                     clock_offsets={node: reading.offset_s for node, reading in clocks.readings.items()})


def _on_rank_nodes(backend: "Backend", request: FaultRequest, task: FaultTask) -> FaultOutcome:
    """The agent on each target rank's node at once; one merged outcome."""
    by_node: dict[str, list[int]] = {}
    for rank in task.ranks:
        by_node.setdefault(read_identity(task.run_dir, task.attempt, rank).node, []).append(rank)
    # Several nodes act together at an agreed moment (each told it on its own clock), or each at the
    # step (an at_step fault).
    together = time.time() + TOGETHER_S if len(by_node) > 1 and task.at_step is None else 0.0
    node_tasks = {node: FaultTask(**{**task.__dict__, "ranks": tuple(ranks),
                                     "not_before": task.on_node(together, node) if together else 0.0})
                  for node, ranks in by_node.items()}
    timeout_s = AGENT_TIMEOUT_S + float(task.options.get("duration_s", 0.0)) + task.wait_s
    with ThreadPoolExecutor(max_workers=len(node_tasks) or 1) as pool:
        futures = [pool.submit(_on_node, backend, request, node, node_task, timeout_s)
                   for node, node_task in node_tasks.items()]
        outcomes: list[FaultOutcome] = []
        missed: list[TargetRefused] = []  # gone, or (at_step) short of the step when its wait ran out
        for future in futures:
            try:
                outcomes.append(future.result())
            except TargetRefused as error:
                if not (error.gone or isinstance(error, StepNotReached)) or len(futures) == 1:
                    raise
                missed.append(error)
    if not outcomes:  # short of the step somewhere: sent again; else every node's ranks were gone
        raise next((error for error in missed if isinstance(error, StepNotReached)), missed[0])
    # A node whose ranks were gone by the agreed moment: the job was already ending, from this
    # very fault's other half (srun ends the step when one rank dies). One whose agent's wait ran
    # out a moment before the step: the other nodes' acts stand.
    return _merged(outcomes, missed, task)


def _on_node(backend: "Backend", request: FaultRequest, node: str, task: FaultTask, timeout_s: float) -> FaultOutcome:
    record = request.run.paths.attempt_dir(request.attempt) / f"fault-{task.kind}-{uuid.uuid4().hex[:8]}.json"
    argv = ["-m", "injectors.agent", task.kind, "--task", json.dumps(task.to_json_dict()), "--record", str(record)]
    result = backend.run_agent(request.job_id, node, argv, timeout_s)
    return agent_verdict(result, record)


def agent_verdict(result: CommandResult, record: Path) -> FaultOutcome:
    """The agent's verdict: its record file (written right after it acts) or its stdout line."""
    try:
        answers = [json.loads(record.read_text())] if record.exists() else []
    except json.JSONDecodeError:
        answers = []
    answers += [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for answer in answers:
        if answer.get("ok"):
            fields = {key: answer[key] for key in ("kind", "target", "at", "node", "pid", "signal", "detail")}
            fields["met_step"] = answer.get("met_step")
            return FaultOutcome(**fields)
        why = f"fault agent refused: {answer.get('error', result.stderr)}"
        if answer.get("not_reached"):
            raise StepNotReached(why)
        raise TargetRefused(why, gone=bool(answer.get("gone")))
    if _JOB_ENDED.search(result.stderr):
        raise TargetRefused(f"the target's job is ending: {result.stderr.strip()[-500:]}", gone=True)
    raise CommandError(result.args, result.returncode, result.stdout, result.stderr, "fault agent gave no answer")


def _merged(outcomes: list[FaultOutcome], missed: list[TargetRefused], task: FaultTask) -> FaultOutcome:
    """One outcome of several nodes' agents: the first to act (its moment and node, compared on the
    login clock: each agent stamps its own), and how far apart they acted."""
    if len(outcomes) == 1 and not missed:
        return outcomes[0]
    on_login = {id(outcome): task.on_login(outcome.at, outcome.node) for outcome in outcomes}
    first = min(outcomes, key=lambda outcome: on_login[id(outcome)])
    spread = max(on_login.values()) - on_login[id(first)]
    details = [o.detail for o in outcomes if o.detail] + [f"{len(outcomes)} nodes acted within {spread:.3f} s"]
    details += [f"{'short of its step when its wait ran out' if isinstance(error, StepNotReached) else 'gone before its agent acted'}: {error}"
                for error in missed]
    return FaultOutcome(kind=first.kind, target="; ".join(o.target for o in outcomes), at=first.at,
                        node=",".join([first.node, *(o.node for o in outcomes if o is not first)]), pid=first.pid, signal=first.signal,
                        detail="; ".join(details), met_step=first.met_step)
