"""The doctor's test job: one task on each node, as the user's job would run there, writing its
node's facts (``injectors.probe facts``) to a folder of the workdir, which the login node waits
to see (how long that took is the shared filesystem's visibility); then, while the job holds its
nodes, a conversation with each node's clock (``injectors.probe echo`` as a step of the job).
Ended (and cancelled) whatever happens. The local backend's "node" is this host."""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from experiments.launchers import Launch, Mpiexec, Shell, script_line, site_release_lines, srun_on_node
from injectors.probe import FACTS_PREFIX
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.pbs.commands import (
    ServerKind,
    detect_server,
    exec_hosts,
    qdel,
    qstat_records,
    qsub,
    record_state,
)
from orchestrator.backends.slurm.backend import parse_sbatch_parsable
from orchestrator.campaign.directives import parse_directive, slurm_line
from orchestrator.campaign.mpi import ROOT_ENVIRONMENT
from orchestrator.commands import CommandError, Conversation, run_command
from orchestrator.doctor.marks import CheckpointMarks
from orchestrator.observe.node_clocks import read_offset
from orchestrator.record.clocks import ClockReading
from orchestrator.states import JobState

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # the job's wait in the queue
FACTS_TIMEOUT_S = 90.0  # a node's facts visible on the login node after the job started
HOLD_S = 300  # the job's own limit on holding its nodes for the clock conversations
UNMARK_WAIT_S = 20.0  # the job's last step (each node's checkpoint file removed) given this long, then cancelled
STATE_POLL_S = 1.0  # the scheduler asked the job's state this often
SCAN_S = 0.05  # the folder looked at for the nodes' facts this often (the visibility's resolution)
ENDED = {"ended": "ended", "gone": "ended (or is gone from qstat: a server that keeps no finished jobs)"}


@dataclass(frozen=True)
class NodeReport:
    node: str
    facts: dict[str, Any] | None
    seen_at: float | None  # the login node's clock when its facts file was first read
    clock: ClockReading | None
    error: str = ""

    @property
    def visible_after_s(self) -> float | None:
        """From the node's write to the login node's read, on the login node's clock."""
        if self.facts is None or self.seen_at is None or self.clock is None:
            return None
        return max(0.0, self.seen_at - (float(self.facts["written_at"]) - self.clock.offset_s))


def probe_environment() -> dict[str, str]:
    """The login node's environment, with this checkout importable (as a drill's job gets it)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def facts_command(python: str, folder: Path, framework: str | None, marks: CheckpointMarks | None) -> list[str]:
    """``injectors.probe facts`` on a node: its facts into ``folder``; with ``marks``, whether it
    sees the login node's file in the checkpoint directory and may write its own."""
    return [python, "-m", "injectors.probe", "facts", "--out-dir", str(folder),
            *(["--framework", framework] if framework else []),
            *(["--checkpoints", str(marks.directory), "--mark", marks.token] if marks is not None else [])]


def unmark_command(python: str, marks: CheckpointMarks) -> list[str]:
    """``injectors.probe unmark`` on a node: its file in the checkpoint directory removed."""
    return [python, "-m", "injectors.probe", "unmark", "--checkpoints", str(marks.directory), "--mark", marks.token]


def probe_local(folder: Path, framework: str | None, marks: CheckpointMarks | None = None,
                python: str = sys.executable) -> list[NodeReport]:
    """This host as the local backend's one node."""
    run_command(facts_command(python, folder, framework, marks), timeout_s=120.0, env=probe_environment())
    [path] = folder.glob(f"{FACTS_PREFIX}*.json")
    facts = json.loads(path.read_text())
    with Conversation([python, "-m", "injectors.probe", "echo"], env=probe_environment()) as probe:
        clock = read_offset(probe)
    return [NodeReport(str(facts["node"]), facts, None, clock)]  # one host: no filesystem between nodes


@dataclass(frozen=True)
class Seen:
    at: float  # the login node's clock when the node's facts file was first read
    facts: dict[str, Any]


@dataclass
class FactsWatch:
    """The nodes' facts files in the job's folder, each read once, when first readable here;
    matched to the scheduler's name for a node by name, else by short name (a node whose host
    name is its FQDN, or the other way round)."""

    folder: Path
    seen: dict[str, Seen] = field(default_factory=dict)  # by the name the node wrote them under

    def scan(self) -> None:
        for path in self.folder.glob(f"{FACTS_PREFIX}*.json"):
            name = path.stem.removeprefix(FACTS_PREFIX)
            if name not in self.seen and (facts := _readable(path)) is not None:
                self.seen[name] = Seen(time.time(), facts)

    def of(self, host: str) -> Seen | None:
        if host in self.seen:
            return self.seen[host]
        short = _short(host)
        return next((seen for name, seen in self.seen.items() if _short(name) == short), None)

    def nodes(self) -> list[str]:
        return sorted(self.seen)


def _short(name: str) -> str:
    return name.split(".", 1)[0]


@dataclass
class JobProbe(ABC):
    """The test job on a scheduler: submitted, waited on until it runs, its nodes' facts read as
    they arrive, each node's clock read through a step of it, then ended whatever happens."""

    folder: Path
    nodes: int
    partition: str | None
    framework: str | None
    extra_directives: tuple[str, ...] = ()
    marks: CheckpointMarks | None = None  # in the spec's checkpoint directory: does each node see it?
    python: str = sys.executable
    job_id: str | None = None
    ran: bool = False  # the scheduler said it ran

    def run(self) -> list[NodeReport]:
        """One report for each of the ``nodes`` nodes asked for, whether it answered or not."""
        watch = FactsWatch(self.folder)
        try:
            self.job_id = self._submit()
            hosts = self._started(watch)
            self._expect(hosts)
            self._wait_for_facts(watch, hosts)
            reports = [self._report(host, watch.of(host)) for host in hosts or watch.nodes()[:self.nodes]]
            self._expect(str(report.facts["node"]) for report in reports if report.facts)
            if self.marks is not None:  # while the job runs: its last step removes them
                self.marks.look(str(report.facts["node"]) for report in reports
                                if report.facts and (report.facts.get("checkpoints") or {}).get("wrote"))
            return [*reports, *self._unnamed(len(reports))]
        finally:
            (self.folder / "done").touch()
            if self.job_id is not None:
                self._end_job(self.job_id)

    def _end_job(self, job_id: str) -> None:
        """The test job ended: by itself where it ran and has a last step (each node's file in the
        checkpoint directory removed), within UNMARK_WAIT_S; cancelled in any case, even if the
        wait is interrupted."""
        ended = False
        try:
            if self.marks is not None and self.ran:
                ended = self._await_end(UNMARK_WAIT_S)
        finally:
            if self.marks is not None:
                self.marks.ended_by_itself = ended
            try:
                self._cancel(job_id)
            except CommandError as error:  # the job ends by itself (the done file, its time limit)
                log.warning("cancelling the test job %s failed: %s", job_id, error.summary)

    def _expect(self, nodes: Iterable[str]) -> None:
        """Nodes whose files in the checkpoint directory are removed after."""
        if self.marks is not None:
            self.marks.expect(nodes)

    def facts_command(self) -> list[str]:
        return facts_command(self.python, self.folder, self.framework, self.marks)

    def hold_line(self) -> str:
        """The job holds its nodes until the doctor is done with them (or HOLD_S)."""
        done = shlex.quote(str(self.folder / "done"))
        return f"while [ ! -e {done} ] && [ $SECONDS -lt {HOLD_S} ]; do sleep 0.2; done"

    def unmark_command(self) -> list[str] | None:
        """The job's last step, on every node: its file in the checkpoint directory removed."""
        return unmark_command(self.python, self.marks) if self.marks is not None else None

    def _await_end(self, within_s: float) -> bool:
        """Until the job ended by itself (its last step done), at most ``within_s``: whether it did."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                if self._state()[0] in ENDED:
                    return True
            except CommandError:
                return False
            time.sleep(STATE_POLL_S / 4)
        return False

    @abstractmethod
    def script(self) -> str: ...

    @abstractmethod
    def _submit(self) -> str: ...

    @abstractmethod
    def _state(self) -> tuple[str, list[str]]:
        """The job's state ("running", "queued", "ended", or "gone": the scheduler no longer knows
        it) and, once it runs, its nodes (empty where the scheduler does not say: they are then the
        nodes whose facts arrive)."""

    @abstractmethod
    def _cancel(self, job_id: str) -> None: ...

    @abstractmethod
    def _on_node(self, host: str, argv: list[str]) -> Conversation: ...

    def _started(self, watch: FactsWatch) -> list[str]:
        """The job's nodes once it runs (CommandError if it ends or does not start in time). The
        nodes' facts are watched for all along, at a short interval: a node may write them before
        the scheduler says it runs, and the moment they are read here is what is measured."""
        deadline = time.monotonic() + START_TIMEOUT_S
        next_poll = time.monotonic()
        while time.monotonic() < deadline:
            watch.scan()
            if time.monotonic() >= next_poll:
                state, hosts = self._state()
                if state == "running":
                    self.ran = True
                    return hosts
                if state in ENDED:
                    raise CommandError(["qstat"], 0, "", "", f"the test job {self.job_id} {ENDED[state]} before it "
                                       f"ran (its output: {self._output()})")
                next_poll = time.monotonic() + STATE_POLL_S
            time.sleep(SCAN_S)
        raise CommandError(["qstat"], None, "", "", f"the test job {self.job_id} did not start within "
                           f"{START_TIMEOUT_S:g} s")

    def _wait_for_facts(self, watch: FactsWatch, hosts: list[str]) -> None:
        """Until each named node's facts (any ``nodes`` nodes' where the scheduler named none) were
        read here, or FACTS_TIMEOUT_S."""
        deadline = time.monotonic() + FACTS_TIMEOUT_S
        while time.monotonic() < deadline:
            watch.scan()
            if (all(watch.of(host) for host in hosts) if hosts else len(watch.nodes()) >= self.nodes):
                return
            time.sleep(SCAN_S)

    def _report(self, host: str, seen: Seen | None) -> NodeReport:
        if seen is None:
            return NodeReport(host, None, None, None, f"no facts from {host} within {FACTS_TIMEOUT_S:g} s of the "
                              f"job's start (its output: {self._output()})")
        try:
            with self._on_node(host, ["-m", "injectors.probe", "echo"]) as probe:
                clock = read_offset(probe)
        except CommandError as error:
            return NodeReport(host, seen.facts, seen.at, None, f"its clock could not be read: {error.summary}")
        return NodeReport(host, seen.facts, seen.at, clock)

    def _unnamed(self, reported: int) -> list[NodeReport]:
        """The nodes asked for that the scheduler did not name and whose facts did not arrive."""
        return [NodeReport(f"node {index + 1} of {self.nodes}", None, None, None,
                           f"the scheduler named none of the job's nodes, and only {reported} of {self.nodes} nodes' "
                           f"facts arrived within {FACTS_TIMEOUT_S:g} s (its output: {self._output()})")
                for index in range(reported, self.nodes)]

    def _output(self) -> str:
        try:
            return (self.folder / "job.out").read_text().strip()[-300:] or "none"
        except OSError:
            return "none"


@dataclass
class SlurmProbe(JobProbe):
    def script(self) -> str:
        q = shlex.quote
        directives = ["-J fd-doctor", f"-N {self.nodes}", "--ntasks-per-node=1", "-t 10",
                      f"-o {q(str(self.folder / 'job.out')).replace('%', '%%')}",
                      *([f"-p {q(self.partition)}"] if self.partition else []),
                      *(slurm_line(parse_directive(text)) for text in self.extra_directives)]
        return "\n".join(["#!/bin/bash", *(f"#SBATCH {line}" for line in directives),
                          f"export PYTHONPATH={q(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}",
                          f"srun --ntasks-per-node=1 {shlex.join(self.facts_command())}", self.hold_line(),
                          *([f"srun --ntasks-per-node=1 {shlex.join(unmark)}"]
                            if (unmark := self.unmark_command()) is not None else []), ""])

    def _submit(self) -> str:
        path = self.folder / "probe.sbatch"
        path.write_text(self.script())
        result = run_command(["sbatch", "--parsable", str(path)], cwd=self.folder, timeout_s=60.0)
        return parse_sbatch_parsable(result.stdout)

    def _state(self) -> tuple[str, list[str]]:
        assert self.job_id is not None
        answer = run_command(["squeue", "-h", "-j", self.job_id, "-o", "%T|%N"], timeout_s=20.0, check=False)
        state, _, nodelist = answer.stdout.strip().partition("|")
        if state == "RUNNING" and nodelist:
            return "running", run_command(["scontrol", "show", "hostnames", nodelist], timeout_s=20.0).stdout.split()
        return ("ended" if answer.returncode == 0 and not answer.stdout.strip() else "queued"), []

    def _cancel(self, job_id: str) -> None:
        run_command(["scancel", job_id], timeout_s=20.0, check=False)

    def _on_node(self, host: str, argv: list[str]) -> Conversation:
        assert self.job_id is not None
        return Conversation(srun_on_node(self.job_id, host, [self.python, *argv]), env=probe_environment())


@dataclass
class PBSProbe(JobProbe):
    """The test job through qsub (PBS Pro, Torque, or Slurm's Torque wrappers): one task a node,
    started as the drill's ranks are (Open MPI's mpiexec, one per node); each node's clock read as
    the fault agent reaches a node (the PBS backend: a step under the wrappers, else ssh)."""

    def script(self) -> str:
        q = shlex.quote
        if detect_server() is ServerKind.PRO:
            chunks = [f"-l select={self.nodes}:ncpus=1:mpiprocs=1", "-l place=scatter"]
        else:
            chunks = [f"-l nodes={self.nodes}:ppn=1"]
        extra = [parse_directive(text) for text in self.extra_directives]
        directives = ["-N fd-doctor", *chunks, "-l walltime=00:10:00", "-j oe", "-o job.out",
                      *([f"-q {q(self.partition)}"] if self.partition else []),
                      *(f"{d.flag} {d.value}" if d.value is not None else d.flag for d in extra)]
        mpiexec = Mpiexec(forwarded=("PYTHONPATH",), session_dir=Shell('"$ompi_tmp"'))
        steps = [script_line(mpiexec, Launch(command=command, tasks=self.nodes, tasks_per_node=1))
                 for command in (self.facts_command(), self.unmark_command()) if command is not None]
        as_root = [f"export {name}={value}" for name, value in ROOT_ENVIRONMENT.items()] if os.geteuid() == 0 else []
        return "\n".join(["#!/bin/bash", *(f"#PBS {line}" for line in directives), *as_root,
                          f"export PYTHONPATH={q(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}",
                          'ompi_tmp=$(mktemp -d "${TMPDIR:-/tmp}/faultdrill-ompi.XXXXXXXXXX") || exit 1',
                          site_release_lines(),
                          steps[0], self.hold_line(), *steps[1:], 'rm -rf "$ompi_tmp"', ""])

    def _submit(self) -> str:
        return qsub("probe.pbs", self._written(), self.folder)

    def _written(self) -> str:
        text = self.script()
        (self.folder / "probe.pbs").write_text(text)
        return text

    def _state(self) -> tuple[str, list[str]]:
        """From the job's ``qstat -f`` record, its nodes too; no record: the server no longer knows
        the job (PBS Pro without job history forgets a finished job), so it ended."""
        assert self.job_id is not None
        records = qstat_records([self.job_id], detect_server())
        record = records.get(self.job_id) or next(iter(records.values()), None)  # one id asked: its record
        if record is None:
            return "gone", []
        state = record_state(self.job_id, record, None)
        if state is JobState.RUNNING:
            return "running", exec_hosts(record)
        return ("ended" if state.is_terminal else "queued"), []

    def _cancel(self, job_id: str) -> None:
        qdel(job_id, None)

    def _on_node(self, host: str, argv: list[str]) -> Conversation:
        assert self.job_id is not None
        return PBSBackend("doctor", python=self.python).talk_on_node(self.job_id, host, argv)


def _readable(path: Path) -> dict[str, Any] | None:
    """The facts, once opened and whole, not only listed: a network filesystem may list a name
    before its data is visible."""
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) and facts.get("written_at") else None
