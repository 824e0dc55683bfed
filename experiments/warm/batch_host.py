"""The warm coordinator's host in a batch job: the batch script runs it in place of its rank launch
(restart.strategy warm; templates/slurm.sbatch.j2 with ``--launcher srun``, templates/pbs.j2 with
``--launcher mpiexec``).

Every member (the ranks, then the warm spares) is a launch of its own, one task on one node: a node
that crashes ends the launches on it, never the survivors' (one launch of all tasks would be
aborted whole by srun or mpiexec). The ranks are spread over the nodes as the job's own tasks would
be, ``ranks_per_node`` each, the spares after them. The coordinator listens on this node's address;
its verdict is this process's exit code (0: the run completed), which the batch script records as
the step's exit.

- ``srun`` (Slurm): a member is a job step ``srun --overlap --nodes=1 --ntasks=1 --nodelist=N``.
- ``mpiexec`` (PBS, Open MPI; through TM on a PBS site, through srun under Slurm's Torque
  wrappers): a member is ``mpiexec -n 1 --host N``, which exports the named variables (``-x``) to
  a node that does not inherit this environment.

``--restart-all`` (TensorFlow, Chainer): the ranks and the spares are sets, each one launch of all
the set's tasks over the job's nodes (an MPI world of its own: ``srun --mpi pmix``, or mpiexec's),
with its own ports; the coordinator retires a set after a failure by ending its launch.

    python -m experiments.warm.batch_host --launcher srun|mpiexec --attempt A --job J
        --nodes n1,n2 --ranks-per-node 1 --spares-per-node 1 [--restart-all --spare-sets 1 [--mpi pmix]]
        [--forward NAME,NAME] --output PATTERN --error PATTERN -- COMMAND...
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping

from experiments.launchers import Launch, Mpiexec, MpiRuntime, Srun, argv, runtime_here
from experiments.layout import (
    ENV_ATTEMPT,
    ENV_DRILL_ID,
    ENV_MASTER_PORT,
    ENV_RUN_DIR,
    ENV_WARM_COORDINATOR,
    ENV_WARM_SECRET,
    ENV_WARM_SET,
    ENV_WARM_SLOT,
    RunPaths,
    append_json_line,
)
from experiments.runtime.distenv import derive_port
from experiments.runtime.fence import Fence
from experiments.warm.coordinator import ANYWHERE, Coordinator, CoordinatorGaveUp, Placement, SpareNotStarted
from experiments.warm.held_fence import HeldFence
from experiments.warm.processes import end_members, processes_of, retire
from experiments.warm.protocol import new_secret, set_port
from experiments.warm.store_host import StoreHost

log = logging.getLogger("faultdrill.warm")

# What a member needs from this process's environment beyond the batch script's variables.
WARM_VARIABLES = (ENV_WARM_COORDINATOR, ENV_WARM_SECRET, ENV_WARM_SLOT, ENV_WARM_SET, ENV_ATTEMPT, ENV_MASTER_PORT)


def _own_address() -> str:
    """Where the members reach the coordinator: this host's name's address, unless that is a loopback
    one (a Debian /etc/hosts names the host 127.0.1.1, while the other nodes resolve it to the
    cluster network): then every interface, the channel's proof of the secret still required."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""
    return "" if address.startswith("127.") else address


def site_runtime() -> MpiRuntime:
    """The node's Open MPI, as its mpiexec says (Open MPI 5: PRRTE's session-directory option)."""
    return runtime_here("mpiexec")


@dataclass(frozen=True)
class MemberLaunch:
    """One member's launch: its command line, and where its output goes when the launcher does not
    write it itself (mpiexec)."""

    argv: list[str]
    stdout: str | None = None
    stderr: str | None = None


@dataclass(frozen=True)
class SrunMembers:
    """Slurm: each launch a job step sharing the job's CPUs with the others (``--overlap``); srun
    writes its tasks' output itself (``%t``: the task)."""

    mpi: str = ""

    def member(self, slot: int, node: str, output: str, error: str, command: list[str],
               env: Mapping[str, str]) -> MemberLaunch:
        launch = Launch(command, tasks=1, nodes=1, hosts=[node], name=f"faultdrill-warm-{slot}", output=output,
                        error=error, overlap=True, kill_on_bad_exit=False)
        return MemberLaunch(argv(Srun().words(launch)))

    def spare_set(self, number: int, nodes: list[str], per_node: int, output: str, error: str,
                  command: list[str], env: Mapping[str, str]) -> MemberLaunch:
        def named(pattern: str) -> str:  # set 0's tasks write the ranks' usual files
            return pattern if number == 0 else pattern.replace("%t", f"set{number}-%t")

        launch = Launch(command, tasks=len(nodes) * per_node, nodes=len(nodes), tasks_per_node=per_node, hosts=nodes,
                        name=f"faultdrill-warm-set-{number}", output=named(output), error=named(error),
                        mpi=self.mpi, overlap=True, kill_on_bad_exit=False)  # survivors serve their state
        return MemberLaunch(argv(Srun().words(launch)))

    def environment(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class MpiexecMembers:
    """PBS: each launch an Open MPI mpiexec with the variables a member needs exported (-x) and a
    session directory of its own; the output of a launch goes to one file (``%t``: its first slot)."""

    forwarded: tuple[str, ...]
    session_dir: str

    def member(self, slot: int, node: str, output: str, error: str, command: list[str],
               env: Mapping[str, str]) -> MemberLaunch:
        words = self._mpiexec(f"slot-{slot}", env).words(Launch(command, tasks=1, hosts=[node]))
        return MemberLaunch(argv(words), stdout=output, stderr=error)

    def spare_set(self, number: int, nodes: list[str], per_node: int, output: str, error: str,
                  command: list[str], env: Mapping[str, str]) -> MemberLaunch:
        def named(pattern: str) -> str:  # one file for the whole set
            return pattern.replace("%t", f"set{number}")

        launch = Launch(command, tasks=len(nodes) * per_node, tasks_per_node=per_node, hosts=nodes)
        return MemberLaunch(argv(self._mpiexec(f"set-{number}", env, survivors_stay=True).words(launch)),
                            stdout=named(output), stderr=named(error))

    def _mpiexec(self, launch: str, env: Mapping[str, str], survivors_stay: bool = False) -> Mpiexec:
        """The variables of ``env`` that a member needs, and this launch's own session directory: a new
        one of a random name (0700), made when the launch is, so that no user of another node can
        know its name before the launch shows it (a spare set launches minutes after the job starts)."""
        session_dir = tempfile.mkdtemp(prefix=f"{launch}-", dir=self.session_dir)
        forwarded = tuple(name for name in sorted({*self.forwarded, *WARM_VARIABLES}) if name in env)
        return Mpiexec(forwarded=forwarded, session_dir=session_dir, runtime=site_runtime(),
                       survivors_stay=survivors_stay)

    def environment(self) -> dict[str, str]:
        # Under Slurm's Torque wrappers mpiexec starts its remote daemons with srun: each launch's
        # step must share the allocation's CPUs with the members already running (--overlap).
        return {"OMPI_MCA_plm_slurm_args": "--overlap"} if os.environ.get("SLURM_JOB_ID") else {}


MemberLauncher = SrunMembers | MpiexecMembers


class BatchWarmJob:
    def __init__(self, args: argparse.Namespace, launcher: MemberLauncher) -> None:
        self.args = args
        self.launcher = launcher
        self.paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        self.nodes = args.nodes.split(",")  # the allocation's: the ranks' first, then any spare nodes
        self.rank_nodes = args.rank_nodes or len(self.nodes)
        self.world = self.rank_nodes * args.ranks_per_node
        self.port_base = derive_port(f"warm-{args.job}")
        self.launches: dict[int, subprocess.Popen[bytes]] = {}
        self.coordinator: Coordinator | None = None
        self._lock = threading.Lock()

    def run(self) -> str:
        listener = socket.create_server((_own_address(), 0))
        os.environ[ENV_WARM_COORDINATOR] = f"{socket.gethostname()}:{listener.getsockname()[1]}"
        os.environ[ENV_WARM_SECRET] = secret = new_secret()  # the members' environment only: the user's and root's
        os.environ.update(self.launcher.environment())
        signal.signal(signal.SIGUSR2, self._forward_warning)
        restart_all = self.args.restart_all
        self.coordinator = coordinator = Coordinator(
            world_size=self.world,
            spares_wanted=self.args.spare_sets if restart_all else len(self.nodes) * self.args.spares_per_node,
            first_attempt=self.args.attempt, port_base=self.port_base,
            events=lambda attempt, event: append_json_line(self.paths.coordinator_events_file(attempt), event),
            fence=HeldFence(self.paths, Fence(self.args.attempt, self.args.job, os.environ.get(ENV_DRILL_ID))).advance,
            secret=secret,
            spawn=self._spawn_set if restart_all else self._spawn, restart_all=restart_all, end=self._end_slots,
            stores=None if restart_all else StoreHost(socket.gethostname()))
        if restart_all:
            for number in range(1 + self.args.spare_sets):
                self._spawn_set(number * self.world, self.args.attempt)
        else:
            for slot, node in enumerate(self._placement()):
                self._spawn(slot, self.args.attempt, Placement(node=node))
        try:
            return coordinator.serve(listener)
        except CoordinatorGaveUp as error:
            log.warning("%s", error)
            return str(error)
        finally:
            self._end_launches()

    def _placement(self) -> list[str]:
        """Slot -> node: the ranks ranks_per_node a node (slot r is rank r at first), then the spares
        (spares_per_node on every node of the allocation, spare nodes too)."""
        ranks = [node for node in self.nodes[:self.rank_nodes] for _ in range(self.args.ranks_per_node)]
        spares = [node for node in self.nodes for _ in range(self.args.spares_per_node)]
        return ranks + spares

    def _spawn(self, slot: int, attempt: int, where: Placement) -> None:
        """One member in ``slot`` on the coordinator's node (this node when it names none)."""
        def named(pattern: str) -> str:
            return pattern.replace("%t", str(slot))

        env = {**os.environ, ENV_WARM_SLOT: str(slot), ENV_ATTEMPT: str(attempt)}
        launch = self.launcher.member(slot, where.node or self.nodes[0], named(self.args.output), named(self.args.error),
                                      self.args.command, env)
        self._start(launch, env, [slot])

    def _spawn_set(self, first_slot: int, attempt: int, where: Placement = ANYWHERE) -> None:
        """restart-all: the set whose first slot is ``first_slot``, one launch of all its tasks
        (ranks_per_node on each of its nodes: ``set_nodes``), on its own block of ports."""
        number = first_slot // self.world
        nodes = set_nodes(self.nodes, self.rank_nodes, number, where.avoid)
        env = {**os.environ, ENV_WARM_SET: str(number), ENV_ATTEMPT: str(attempt),
               ENV_MASTER_PORT: str(set_port(self.port_base, number, self.world))}
        launch = self.launcher.spare_set(number, nodes, self.args.ranks_per_node,
                                         self.args.output, self.args.error, self.args.command, env)
        self._start(launch, env, list(range(first_slot, first_slot + self.world)))

    def _start(self, launch: MemberLaunch, env: dict[str, str], slots: list[int]) -> None:
        with _output(launch.stdout) as stdout, _output(launch.stderr) as stderr:
            process = subprocess.Popen(launch.argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        with self._lock:
            for slot in slots:
                self.launches[slot] = process
        threading.Thread(target=self._watch, args=(process, slots), name=f"warm-launch-{slots[0]}", daemon=True).start()

    def _watch(self, process: "subprocess.Popen[bytes]", slots: list[int]) -> None:
        """The coordinator hears when a launch ends (one that failed before its members said hello
        is none on its way)."""
        process.wait()
        if self.coordinator is not None:
            self.coordinator.launch_ended(slots)

    def _end_slots(self, slots: list[int]) -> None:
        """A retired set: its launch ended (srun and mpiexec forward SIGTERM to their tasks, then
        kill), and waited for."""
        retire(self._processes(slots), stop=lambda process: process.terminate())

    def _processes(self, slots: list[int]) -> list["subprocess.Popen[bytes]"]:
        with self._lock:
            return processes_of(self.launches, slots)

    def _forward_warning(self, signum: int, _frame: object) -> None:
        """The batch script's walltime warning (PBS): every member's launch passes it to its tasks."""
        for process in self._processes(sorted(self.launches)):
            if process.poll() is None:
                process.send_signal(signum)

    def _end_launches(self) -> None:
        end_members(self._processes(sorted(self.launches)), stop=subprocess.Popen.terminate)


def set_nodes(nodes: list[str], count: int, number: int, avoid: frozenset[str] = frozenset()) -> list[str]:
    """The ``count`` nodes of spare set ``number``: the batch node (the coordinator's: the job ends
    with it) and ``count - 1`` of the others, taken in turn set by set, so that with spare nodes in
    the allocation consecutive sets differ and a node crash leaves a set whole; never a node in
    ``avoid``. Set 0 (the ranks at first) is the ranks' own nodes."""
    first, others = nodes[0], [node for node in nodes[1:] if node not in avoid]
    if count - 1 > len(others):
        raise SpareNotStarted(f"a spare set needs {count} node(s); the job has {1 + len(others)} left "
                              f"(lost: {', '.join(sorted(avoid)) or 'none'})")
    if not others or count == 1:
        return [first]
    offset = (number * (count - 1)) % len(others) if len(others) > count - 1 else 0
    turn = others[offset:] + others[:offset]
    return [first, *turn[:count - 1]]


@contextmanager
def _output(path: str | None) -> Iterator[BinaryIO | None]:
    """A launch's output file, opened for appending (None: the launcher writes its own)."""
    if path is None:
        yield None
        return
    with open(path, "ab") as file:
        yield file


def launcher_of(args: argparse.Namespace) -> MemberLauncher:
    if args.launcher == "srun":
        return SrunMembers(mpi=args.mpi)
    forwarded = tuple(name for name in args.forward.split(",") if name)
    # The batch script's own session directory (mktemp -d, 0700); never a predictable one in a shared /tmp.
    session_dir = args.session_dir or tempfile.mkdtemp(prefix="faultdrill-ompi.")
    return MpiexecMembers(forwarded=forwarded, session_dir=session_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=("srun", "mpiexec"), default="srun")
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", required=True, help="the job's nodes, comma-separated, the batch node first")
    parser.add_argument("--rank-nodes", type=int, default=0,
                        help="how many of --nodes run the ranks (the rest are spare nodes); 0: all of them")
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--spares-per-node", type=int, required=True)
    parser.add_argument("--restart-all", action="store_true", help="TensorFlow, Chainer: spares come as whole sets")
    parser.add_argument("--spare-sets", type=int, default=1, help="restart-all: the spare sets the job holds")
    parser.add_argument("--mpi", default="", help="srun, restart-all: srun's --mpi for a set (Chainer: pmix)")
    parser.add_argument("--forward", default="", help="mpiexec: the variables to export to every member (-x)")
    parser.add_argument("--session-dir", default="", help="mpiexec: its session directory base (orte_tmpdir_base)")
    parser.add_argument("--output", required=True, help="a member's stdout; %%t: its slot")
    parser.add_argument("--error", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    verdict = BatchWarmJob(args, launcher_of(args)).run()
    return 0 if verdict == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
