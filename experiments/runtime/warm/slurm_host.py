"""The warm coordinator's host in a Slurm job: the batch script runs it in place of its rank launch
(templates/slurm.sbatch.j2, restart.strategy warm).

Every member (the ranks, then the warm spares) is a job step of its own, one task on one node
(``srun --overlap --nodes=1 --ntasks=1 --nodelist=N``): a node that crashes ends the steps on it,
never the survivors' (one step of all tasks would be aborted whole by srun). The ranks are spread
over the nodes as the job's own tasks would be, ``tasks_per_node`` each, the spares after them. The
coordinator listens on this node's address; its verdict is this process's exit code (0: the run
completed), which the batch script records as the step's exit.

``--restart-all`` (TensorFlow, Chainer): the ranks and the spares are sets, each one step of all the
set's tasks over the job's nodes (``--mpi pmix`` for Chainer: one MPI world per set), with its own
ports; the coordinator retires a set after a failure by ending its step.

    python -m experiments.runtime.warm.slurm_host --attempt A --job J --nodes n1,n2 --ranks-per-node 1
        --spares-per-node 1 [--restart-all --spare-sets 1 [--mpi pmix]] --output PATTERN --error PATTERN
        -- COMMAND...
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from experiments.layout import ENV_ATTEMPT, ENV_MASTER_PORT, ENV_RUN_DIR, RunPaths, append_json_line
from experiments.runtime.distenv import derive_port
from experiments.runtime.fence import Fence, write_fence
from experiments.runtime.warm.coordinator import Coordinator, CoordinatorGaveUp
from experiments.runtime.warm.members import end_members, processes_of
from experiments.runtime.warm.protocol import ENV_COORDINATOR, ENV_SET, ENV_SLOT, set_port

log = logging.getLogger("faultdrill.warm")


class SlurmWarmJob:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.paths = RunPaths(Path(os.environ[ENV_RUN_DIR]))
        self.nodes = args.nodes.split(",")
        self.steps: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def run(self) -> str:
        listener = socket.create_server(("", 0))
        host = socket.gethostname()
        os.environ[ENV_COORDINATOR] = f"{host}:{listener.getsockname()[1]}"
        self.world = len(self.nodes) * self.args.ranks_per_node
        self.port_base = derive_port(f"warm-{self.args.job}")
        restart_all = self.args.restart_all
        coordinator = Coordinator(
            world_size=self.world,
            spares_wanted=self.args.spare_sets if restart_all else len(self.nodes) * self.args.spares_per_node,
            first_attempt=self.args.attempt, port_base=self.port_base,
            events=lambda attempt, event: append_json_line(self.paths.events_file(attempt), event),
            fence=lambda attempt: write_fence(self.paths, Fence(attempt, self.args.job)),
            spawn=self._spawn_set if restart_all else self._spawn, restart_all=restart_all, end=self._end_slots)
        if restart_all:
            for number in range(1 + self.args.spare_sets):
                self._spawn_set(number * self.world, self.args.attempt, None)
        else:
            for slot, node in enumerate(self._placement()):
                self._launch(slot, node, self.args.attempt)
        try:
            return coordinator.serve(listener)
        except CoordinatorGaveUp as error:
            log.warning("%s", error)
            return str(error)
        finally:
            self._end_steps()

    def _placement(self) -> list[str]:
        """Slot -> node: the ranks tasks_per_node a node (slot r is rank r at first), then the spares."""
        ranks = [node for node in self.nodes for _ in range(self.args.ranks_per_node)]
        spares = [node for node in self.nodes for _ in range(self.args.spares_per_node)]
        return ranks + spares

    def _spawn(self, slot: int, attempt: int, node: str | None) -> None:
        self._launch(slot, node or self.nodes[0], attempt)

    def _launch(self, slot: int, node: str, attempt: int) -> None:
        def named(pattern: str) -> str:
            return pattern.replace("%t", str(slot))

        argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--kill-on-bad-exit=0",
                f"--job-name=faultdrill-warm-{slot}", "--unbuffered", f"--output={named(self.args.output)}",
                f"--error={named(self.args.error)}", *self.args.command]
        env = {**os.environ, ENV_SLOT: str(slot), ENV_ATTEMPT: str(attempt)}
        with self._lock:
            self.steps[slot] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)

    def _spawn_set(self, first_slot: int, attempt: int, node: str | None) -> None:
        """restart-all: the set whose first slot is ``first_slot``, one step of all its tasks, placed
        as the job's ranks are (an MPI world of its own with ``--mpi``), on its own block of ports."""
        number = first_slot // self.world

        def named(pattern: str) -> str:
            return pattern if number == 0 else pattern.replace("%t", f"set{number}-%t")

        argv = ["srun", "--overlap", f"--nodes={len(self.nodes)}", f"--ntasks={self.world}",
                f"--ntasks-per-node={self.args.ranks_per_node}", f"--nodelist={','.join(self.nodes)}",
                "--kill-on-bad-exit=1", *([f"--mpi={self.args.mpi}"] if self.args.mpi else []),
                f"--job-name=faultdrill-warm-set-{number}", "--unbuffered", f"--output={named(self.args.output)}",
                f"--error={named(self.args.error)}", *self.args.command]
        env = {**os.environ, ENV_SET: str(number), ENV_ATTEMPT: str(attempt),
               ENV_MASTER_PORT: str(set_port(self.port_base, number, self.world))}
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        with self._lock:
            for slot in range(first_slot, first_slot + self.world):
                self.steps[slot] = process

    def _end_slots(self, slots: list[int]) -> None:
        """A retired set: its step ended (srun forwards SIGTERM to its tasks, then SIGKILL)."""
        for process in self._processes(slots):
            if process.poll() is None:
                process.terminate()

    def _processes(self, slots: list[int]) -> list["subprocess.Popen[bytes]"]:
        with self._lock:
            return processes_of(self.steps, slots)

    def _end_steps(self) -> None:
        # terminate: srun forwards it to its task, then ends the step
        end_members(self._processes(sorted(self.steps)), stop=subprocess.Popen.terminate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", required=True, help="the job's nodes, comma-separated (scontrol show hostnames)")
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--spares-per-node", type=int, required=True)
    parser.add_argument("--restart-all", action="store_true", help="TensorFlow, Chainer: spares come as whole sets")
    parser.add_argument("--spare-sets", type=int, default=1, help="restart-all: the spare sets the job holds")
    parser.add_argument("--mpi", default="", help="restart-all: srun's --mpi for a set (Chainer: pmix)")
    parser.add_argument("--output", required=True, help="a member's stdout; %%t: its slot")
    parser.add_argument("--error", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    verdict = SlurmWarmJob(args).run()
    return 0 if verdict == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
