"""A command run under torchrun, on the rank side: the supervisor (experiments/runtime/command.py) of
each node starts that node's torchrun, and torchrun's workers are the ranks.

- The launch: torchrun's program and the user's options (the spec's), then Faultdrill's placement
  of the workers: this node's rank among the job's nodes, its share of the ranks, a static
  rendezvous at the job's master address and port, ``--max-restarts=0`` (the drill's restart
  strategy recovers, not torchrun) and a rendezvous id that names the run and the job's first
  attempt. Under restart.strategy elastic, torchrun starts its workers again itself: the run's
  restarts, through a c10d rendezvous at that address (ELASTIC_ENV: why); the nodes' order is then
  the rendezvous's.
- The ranks: torchrun starts each worker in a session of its own; the supervisor finds them among
  torchrun's children (their environment names the rendezvous id and their RANK) and registers each
  as its rank, with torchrun as the launcher that started it. Under elastic each round of workers
  is the next attempt (WorkerRegistry says how a round is told).
- The end: torchrun exits 1 when a worker failed; its summary names the first failure's exit code,
  which the supervisor ends with (a worker killed by SIGKILL is a rank killed by SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from experiments.layout import CommandSpec, RankIdentity, RunPaths, record_dict, write_json_atomic
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fence import own_job_id
from experiments.runtime.identity import start_ticks
from experiments.runtime.processes import children_of, environ_of

RUN_ID_VAR = "TORCHELASTIC_RUN_ID"  # in every worker's environment: torchrun's --rdzv-id
# torch 2.13's torchrun, restarting its workers, hangs the next round's init_process_group about half
# the time with the static rendezvous and every time with c10d's store shared with the workers (the
# old round's keys are read: pytorch/pytorch#135712); with c10d and this, 5 of 5 restarts formed.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
WORKER_SCAN_S = 0.05
ROOT_CAUSE = re.compile(r"Root Cause")
EXIT_CODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# torchrun itself ended by a signal it handles (SIGTERM, SIGINT, SIGHUP): it ends its workers and
# exits 1 with no summary, only this.
AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def first_rank(command: CommandSpec, env: DistEnv) -> int:
    """The rank of this node's first worker (torchrun places ranks node by node)."""
    return env.rank * workers_per_node(command, env)


def rendezvous_id(run_id: str, attempt: int) -> str:
    return f"{run_id}-a{attempt}"


def workers_per_node(command: CommandSpec, env: DistEnv) -> int:
    """This node's share of the run's ranks (the local backend's one task: all of them). A node's
    place is its task's rank and world: the launch is one task per node
    (RunConfig.launch_tasks_per_node), whatever the node variables say where the task runs (an
    mpiexec task on a PBS job's second node sees none of the job's: one node, it would say)."""
    if command.torchrun_ranks % env.world_size:
        raise ValueError(f"torchrun: {command.torchrun_ranks} ranks do not split evenly over {env.world_size} nodes")
    return command.torchrun_ranks // env.world_size


def torchrun_argv(command: CommandSpec, env: DistEnv, run_id: str, attempt: int, script: list[str],
                  restarts: int = 0) -> list[str]:
    """The node's torchrun: the spec's program and options, Faultdrill's placement, the script."""
    nodes = [f"--nnodes={env.world_size}", f"--nproc-per-node={workers_per_node(command, env)}"]
    if restarts:  # elastic: the c10d rendezvous, its store not shared with the workers (see ELASTIC_ENV)
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint={env.master_addr}:{env.master_port}"]
    else:
        rendezvous = [f"--node-rank={env.rank}", f"--master-addr={env.master_addr}", f"--master-port={env.master_port}"]
    placement = [*nodes, *rendezvous, f"--rdzv-id={rendezvous_id(run_id, attempt)}", f"--max-restarts={restarts}"]
    return [*command.torchrun, *placement, *script]


# (round, rank, when): the first worker of this later round appeared; a worker of the round before
# (that rank) was seen gone then. Told only now: workers also end when the training does. False:
# the round is not the run's (the controller moved it on): nothing more is registered.
OnRound = Callable[[int, int, float], bool]


@dataclass
class WorkerRegistry:
    """Finds the workers the node's torchrun starts and registers each as its rank of the attempt
    (its round's: the job's first attempt plus the round, under elastic).

    A node's next round is a worker whose RANK this round already had (torchrun starts all of its
    workers again), or any new worker once one of the round was seen gone. Not
    TORCHELASTIC_RESTART_COUNT: it counts only the restarts of the node's own agent, whose workers
    failed; another node's agent starts its workers again under the same count. Under elastic the
    workers must hold the ranks of the node's place (``misplaced`` says why not, and torchrun is
    ended: its c10d rendezvous orders nodes by host name, which may not be the job's order)."""

    paths: RunPaths
    env: DistEnv
    command: CommandSpec
    attempt: int
    run_id: str
    launcher_pid: int
    elastic: bool = False  # torchrun restarts its workers: keep watching for its next rounds
    on_round: OnRound = lambda round_, rank, at: True
    registered: dict[int, int] = field(default_factory=dict)  # worker pid -> its rank (this round's)
    seen: dict[int, int] = field(default_factory=dict)  # every worker of this round, ended ones too
    round: int = 0  # the round of workers seen: how many times this node's were started again
    lost: tuple[int, float] | None = None  # (rank, when) the first worker of this round seen gone
    misplaced: str | None = None
    # on_round's answers, by round, from a thread of their own: the scan goes on meanwhile (a round
    # that came and went while the fence was moved would otherwise go uncounted).
    verdicts: dict[int, Future[bool]] = field(default_factory=dict)
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, rank, round) awaiting its verdict
    _rounds: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "faultdrill-torchrun-rounds"))
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._scan, name="faultdrill-torchrun-workers", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def worker_pids(self) -> list[int]:
        return list(self.registered)

    def _scan(self) -> None:
        expected = rendezvous_id(self.run_id, self.attempt)
        launcher_ticks = start_ticks(self.launcher_pid) or 0
        expected_here = workers_per_node(self.command, self.env)
        while (self.elastic or len(self.registered) < expected_here) and not self._stop.wait(WORKER_SCAN_S):
            if self.elastic:
                self._note_losses()
            for pid in children_of(self.launcher_pid):
                if pid in self.seen or (rank := worker_rank(pid, expected)) is None:
                    continue
                if self.elastic and (self.lost is not None or rank in self.seen.values()):
                    self._next_round()
                self.seen[pid] = rank
                if self.elastic and not self._in_place(rank):
                    return
                self.pending.append((pid, rank, self.round))
            if not self._register_ready(launcher_ticks):
                return

    def _note_losses(self) -> None:
        """The first worker of the round seen gone, and when."""
        if self.lost is not None:
            return
        for pid, rank in list(self.seen.items()):
            if not _alive(pid):
                self.lost = (rank, time.time())
                return

    def _next_round(self) -> None:
        first_rank = next(iter(self.seen.values()), 0)
        rank, at = self.lost if self.lost is not None else (first_rank, time.time())  # it ended between two looks
        self.round, self.registered, self.seen, self.lost = self.round + 1, {}, {}, None
        self.verdicts[self.round] = self._rounds.submit(self.on_round, self.round, rank, at)

    def _register_ready(self, launcher_ticks: int) -> bool:
        """The workers whose round is the run's, registered; False once a round is not (nothing more is)."""
        waiting = []
        for pid, rank, round_ in self.pending:
            verdict = self.verdicts.get(round_)
            if verdict is not None and not verdict.done():
                waiting.append((pid, rank, round_))
            elif verdict is not None and not verdict.result():
                self.pending = []
                return False
            elif round_ == self.round:  # a worker of a round already left behind is no rank
                self._register(pid, rank, round_, launcher_ticks)
        self.pending = waiting
        return True

    def _in_place(self, rank: int) -> bool:
        """The worker's rank is one of this node's place (else torchrun is ended, and why kept)."""
        per_node = workers_per_node(self.command, self.env)
        if rank // per_node == self.env.rank:
            return True
        self.misplaced = (f"restart.strategy elastic: torchrun's c10d rendezvous gave this node ({self.env.node}, the "
                          f"job's node {self.env.rank}) the worker of rank {rank}: it orders the nodes by host name, "
                          "which is not the job's order here, so the drill cannot tell which node's log and events "
                          "are rank 0's; use resubmit or in-allocation on this site")
        os.kill(self.launcher_pid, signal.SIGTERM)
        return False

    def _register(self, pid: int, rank: int, round_: int, launcher_ticks: int) -> None:
        ticks = start_ticks(pid)
        if ticks is None:
            return  # ended already: a worker that never ran is not a rank to aim at
        try:
            group = os.getpgid(pid) == pid
        except ProcessLookupError:
            return
        attempt = self.attempt + round_
        identity = RankIdentity(rank=rank, pid=pid, create_time=time.time(), start_ticks=ticks,
                                host=os.uname().nodename, node=self.env.node, job_id=own_job_id(self.env.job_id),
                                attempt=attempt, group=group, launcher_pid=self.launcher_pid,
                                launcher_start_ticks=launcher_ticks)
        write_json_atomic(self.paths.rank_file(attempt, rank), record_dict(identity))
        self.registered[pid] = rank


def _alive(pid: int) -> bool:
    return start_ticks(pid) is not None  # neither gone nor a zombie


def worker_rank(pid: int, rendezvous: str) -> int | None:
    """The RANK of ``pid`` if it is a worker of the torchrun launch ``rendezvous``; None otherwise."""
    environ = environ_of(pid)
    if environ is None:
        return None  # gone, or not ours to read
    if environ.get(RUN_ID_VAR) != rendezvous or not environ.get("RANK", "").isdigit():
        return None
    return int(environ["RANK"])


def root_cause_exit(stderr_lines: list[str]) -> int | None:
    """The exit code of the first failed worker, as torchrun's failure summary gives it (negative:
    the signal that ended it), or minus the signal that ended torchrun itself; None when the lines
    say neither."""
    for index, line in enumerate(stderr_lines):
        if ROOT_CAUSE.search(line):
            for later in stderr_lines[index + 1:]:
                if match := EXIT_CODE.search(later):
                    return int(match.group(1))
            return None
    for line in reversed(stderr_lines):
        if match := AGENT_SIGNAL.search(line):
            return -int(match.group(1))
    return None
