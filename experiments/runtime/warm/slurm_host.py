"""The warm coordinator's host in a Slurm job: the batch script runs it in place of its rank launch
(templates/slurm.sbatch.j2, restart.strategy warm).

Every member (the ranks, then the warm spares) is a job step of its own, one task on one node
(``srun --overlap --nodes=1 --ntasks=1 --nodelist=N``): a node that crashes ends the steps on it,
never the survivors' (one step of all tasks would be aborted whole by srun). The ranks are spread
over the nodes as the job's own tasks would be, ``tasks_per_node`` each, the spares after them. The
coordinator listens on this node's address; its verdict is this process's exit code (0: the run
completed), which the batch script records as the step's exit.

    python -m experiments.runtime.warm.slurm_host --attempt A --job J --nodes n1,n2 --ranks-per-node 1
        --spares-per-node 1 --output PATTERN --error PATTERN -- COMMAND...
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

from experiments.layout import ENV_ATTEMPT, ENV_RUN_DIR, RunPaths, append_json_line
from experiments.runtime.distenv import derive_port
from experiments.runtime.fence import Fence, write_fence
from experiments.runtime.warm.coordinator import Coordinator, CoordinatorGaveUp
from experiments.runtime.warm.members import end_members
from experiments.runtime.warm.protocol import ENV_COORDINATOR, ENV_SLOT

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
        world = len(self.nodes) * self.args.ranks_per_node
        coordinator = Coordinator(
            world_size=world, spares_wanted=len(self.nodes) * self.args.spares_per_node,
            first_attempt=self.args.attempt, port_base=derive_port(f"warm-{self.args.job}"),
            events=lambda attempt, event: append_json_line(self.paths.events_file(attempt), event),
            fence=lambda attempt: write_fence(self.paths, Fence(attempt, self.args.job)),
            spawn=self._spawn)
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

    def _end_steps(self) -> None:
        # terminate: srun forwards it to its task, then ends the step
        end_members(self.steps.values(), stop=subprocess.Popen.terminate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--nodes", required=True, help="the job's nodes, comma-separated (scontrol show hostnames)")
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--spares-per-node", type=int, required=True)
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
