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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.launchers import srun_on_node
from injectors.probe import FACTS_PREFIX
from orchestrator.backends.slurm.backend import parse_sbatch_parsable
from orchestrator.campaign.directives import parse_directive, slurm_line
from orchestrator.commands import CommandError, Conversation, run_command
from orchestrator.observe.node_clocks import read_offset
from orchestrator.record.clocks import ClockReading

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # the job's wait in the queue
FACTS_TIMEOUT_S = 90.0  # a node's facts visible on the login node after the job started
HOLD_S = 300  # the job's own limit on holding its nodes for the clock conversations
POLL_S = 0.5


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


def probe_local(folder: Path, framework: str | None, python: str = sys.executable) -> list[NodeReport]:
    """This host as the local backend's one node."""
    run_command([python, "-m", "injectors.probe", "facts", "--out-dir", str(folder),
                 *(["--framework", framework] if framework else [])], timeout_s=120.0, env=probe_environment())
    [path] = folder.glob(f"{FACTS_PREFIX}*.json")
    facts = json.loads(path.read_text())
    with Conversation([python, "-m", "injectors.probe", "echo"], env=probe_environment()) as probe:
        clock = read_offset(probe)
    return [NodeReport(str(facts["node"]), facts, None, clock)]  # one host: no filesystem between nodes


@dataclass
class SlurmProbe:
    folder: Path
    nodes: int
    partition: str | None
    framework: str | None
    extra_directives: tuple[str, ...] = ()
    python: str = sys.executable
    job_id: str | None = None

    def run(self) -> list[NodeReport]:
        try:
            self.job_id = self._submit()
            hosts = self._started()
            seen = self._facts_seen(hosts)
            return [self._report(host, seen.get(host)) for host in hosts]
        finally:
            (self.folder / "done").touch()
            if self.job_id is not None:
                try:
                    run_command(["scancel", self.job_id], timeout_s=20.0, check=False)
                except CommandError as error:  # the job ends by itself (the done file, its time limit)
                    log.warning("cancelling the test job %s failed: %s", self.job_id, error.summary)

    def script(self) -> str:
        q = shlex.quote
        directives = ["-J fd-doctor", f"-N {self.nodes}", "--ntasks-per-node=1", "-t 10",
                      f"-o {q(str(self.folder / 'job.out')).replace('%', '%%')}",
                      *([f"-p {q(self.partition)}"] if self.partition else []),
                      *(slurm_line(parse_directive(text)) for text in self.extra_directives)]
        facts = [self.python, "-m", "injectors.probe", "facts", "--out-dir", str(self.folder),
                 *(["--framework", self.framework] if self.framework else [])]
        return "\n".join(["#!/bin/bash", *(f"#SBATCH {line}" for line in directives),
                          f"export PYTHONPATH={q(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}",
                          f"srun --ntasks-per-node=1 {' '.join(q(word) for word in facts)}",
                          f"while [ ! -e {q(str(self.folder / 'done'))} ] && [ $SECONDS -lt {HOLD_S} ]; do sleep 0.2; done",
                          ""])

    def _submit(self) -> str:
        path = self.folder / "probe.sbatch"
        path.write_text(self.script())
        result = run_command(["sbatch", "--parsable", str(path)], cwd=self.folder, timeout_s=60.0)
        return parse_sbatch_parsable(result.stdout)

    def _started(self) -> list[str]:
        """The job's nodes once it runs (CommandError if it does not start in time)."""
        assert self.job_id is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            answer = run_command(["squeue", "-h", "-j", self.job_id, "-o", "%T|%N"], timeout_s=20.0, check=False)
            state, _, nodelist = answer.stdout.strip().partition("|")
            if state == "RUNNING" and nodelist:
                hosts = run_command(["scontrol", "show", "hostnames", nodelist], timeout_s=20.0).stdout.split()
                return hosts
            if answer.returncode == 0 and not answer.stdout.strip():
                raise CommandError(["squeue"], 0, "", "", f"the test job {self.job_id} ended before it ran "
                                   f"(its output: {self._output()})")
            time.sleep(POLL_S * 2)
        raise CommandError(["squeue"], None, "", "", f"the test job {self.job_id} did not start within "
                           f"{START_TIMEOUT_S:g} s")

    def _facts_seen(self, hosts: list[str]) -> dict[str, float]:
        """When each node's facts file was first read here (the login node's clock)."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + FACTS_TIMEOUT_S
        while len(seen) < len(hosts) and time.monotonic() < deadline:
            for host in hosts:
                if host not in seen and _readable(self.folder / f"{FACTS_PREFIX}{host}.json"):
                    seen[host] = time.time()
            time.sleep(POLL_S / 5)
        return seen

    def _report(self, host: str, seen_at: float | None) -> NodeReport:
        if seen_at is None:
            return NodeReport(host, None, None, None, f"no facts from {host} within {FACTS_TIMEOUT_S:g} s of the "
                              f"job's start (its output: {self._output()})")
        facts = json.loads((self.folder / f"{FACTS_PREFIX}{host}.json").read_text())
        assert self.job_id is not None
        try:
            with Conversation(srun_on_node(self.job_id, host, [self.python, "-m", "injectors.probe", "echo"]),
                              env=probe_environment()) as probe:
                clock = read_offset(probe)
        except CommandError as error:
            return NodeReport(host, facts, seen_at, None, f"its clock could not be read: {error.summary}")
        return NodeReport(host, facts, seen_at, clock)

    def _output(self) -> str:
        try:
            return (self.folder / "job.out").read_text().strip()[-300:] or "none"
        except OSError:
            return "none"


def _readable(path: Path) -> bool:
    """Opened, not only listed: a network filesystem may list a name before its data is visible."""
    try:
        return bool(json.loads(path.read_text()).get("written_at"))
    except (OSError, ValueError):
        return False
