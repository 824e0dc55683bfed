"""The tools users would otherwise pick, on the same fault as Faultdrill's drills (bench/ttr.py):

- rank SIGKILL: ``torchrun --standalone --max-restarts`` (local; its failed restarts are counted);
- node crash: Slurm's own ``sbatch --requeue`` (the job's last node crashed through scripts/cluster);
- preemption: submitit's ``Checkpointable`` (SIGUSR2: ``checkpoint()``, then ``scontrol requeue``).

Each trial trains the same MLP (same width, batch and checkpoint interval as the drills) with a
plain loop that checkpoints to one file and resumes from it, and logs every step with its wall
time and restart count; time to recover is the fault to the first step logged after the restart.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.commands import run_command  # noqa: E402

CLUSTER = REPO / "scripts" / "cluster"

# One training loop for every peer: rank/world/master from torchrun's or Slurm's variables.
TRAIN_SCRIPT = r'''
import json, os, signal, subprocess, sys, time
from datetime import timedelta
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # a preemption's warning is for the job's manager, not the loop
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
steps, every, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:
    nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                      MASTER_ADDR=nodes[0], MASTER_PORT=os.environ.get("BENCH_PORT", "29611"))
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get("SLURM_RESTART_COUNT", "0")))
torch.manual_seed(0)
width = int((%(params)d / 2) ** 0.5)
net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
model = nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
ckpt, start = out / "ckpt.pt", 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=False)
    net.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"]); start = state["step"]
log = open(out / f"steps-{rank}.jsonl", "a")
(out / f"pid-{rank}-{restart}").write_text(json.dumps({"pid": os.getpid(), "node": os.uname().nodename}))
for step in range(start + 1, steps + 1):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(%(batch)d, width, generator=g)
    loss = nn.functional.mse_loss(model(x), torch.tanh(x))
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    log.write(json.dumps({"step": step, "time": time.time(), "restart": restart}) + "\n"); log.flush()
    if step %% every == 0 and rank == 0:
        tmp = out / ".ckpt.tmp"
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
        with open(tmp, "rb") as f: os.fsync(f.fileno())
        os.replace(tmp, ckpt)
dist.destroy_process_group()
'''


@dataclass(frozen=True)
class Workload:
    params: int
    batch: int
    every: int  # checkpoint interval, steps
    steps: int


def write_train_script(out: Path, workload: Workload) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    script = out / "train.py"
    script.write_text(TRAIN_SCRIPT % {"params": workload.params, "batch": workload.batch})
    return script


def wait_for(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return False


def steps_logged(out: Path, rank: int) -> list[dict[str, Any]]:
    path = out / f"steps-{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def recovery(out: Path, fault_at: float, restarted: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
    """The first step rank 0 logged after the restart: ttr and the steps lost since the fault."""
    last_before = max((s["step"] for s in steps_logged(out, 0) if s["time"] <= fault_at), default=0)
    if not wait_for(lambda: any(restarted(s) for s in steps_logged(out, 0)), timeout_s, poll_s=0.1):
        return {"recovered": False, "why": f"no step after the restart within {timeout_s:g} s"}
    first = min((s for s in steps_logged(out, 0) if restarted(s)), key=lambda s: s["time"])
    return {"recovered": True, "ttr_s": first["time"] - fault_at, "lost_steps": max(0, last_before - (first["step"] - 1))}


# --- torchrun ------------------------------------------------------------------------------------


def torchrun_trial(root: Path, trial: int, workload: Workload, rng: random.Random) -> dict[str, Any]:
    """One torchrun job, one worker SIGKILLed a random time after the first checkpoint."""
    out = root / f"torchrun-{trial}"
    script = write_train_script(out, workload)
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                 "--nproc-per-node", "2", "--max-restarts", "3", str(script), str(workload.steps),
                                 str(workload.every), str(out)], stdout=subprocess.DEVNULL,
                                stderr=open(out / "torchrun.log", "w"), env={**os.environ, "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
    try:
        if not wait_for(lambda: (out / "ckpt.pt").exists(), 300):
            return {"recovered": False, "why": "no first checkpoint"}
        time.sleep(min(rng.expovariate(1 / 2.0), 4.0))
        victim = json.loads((out / "pid-1-0").read_text())["pid"]
        if victim not in {child.pid for child in psutil.Process(launcher.pid).children(recursive=True)}:
            return {"recovered": False, "why": f"pid {victim} is not a worker of our torchrun"}
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        found = recovery(out, killed_at, lambda s: s["restart"] > 0, 120)
        if found["recovered"]:
            launcher.wait(timeout=600)
            found["recovered"] = launcher.returncode == 0
            found["exit_code"] = launcher.returncode
        return found
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)  # the session we started, and only it
            launcher.wait()


# --- Slurm's own requeue after a node crash --------------------------------------------------------


def slurm_requeue_trial(root: Path, trial: int, workload: Workload, partition: str, down_s: float) -> dict[str, Any]:
    """``sbatch --requeue`` of the plain loop on two nodes; the job's last node crashes (scripts/cluster)
    after the first checkpoint and comes back ``down_s`` later; Slurm requeues the job itself. A failed
    step leaves the batch script running (as a script with more work after it would): a job whose own
    script ended first is FAILED, not NODE_FAIL, and Slurm requeues only on the node's failure."""
    out = root / f"requeue-{trial}"
    script = write_train_script(out, workload)
    batch = out / "job.sbatch"
    batch.write_text("\n".join([
        "#!/bin/bash", f"#SBATCH --job-name=bench-requeue-{trial}", f"#SBATCH --partition={partition}",
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", "#SBATCH --requeue",
        "#SBATCH --time=00:20:00", f"#SBATCH --output={out}/job-%j.out",
        f"export BENCH_PORT={29700 + trial}", "export OMP_NUM_THREADS=1",
        f"srun --kill-on-bad-exit=1 {sys.executable} {script} {workload.steps} {workload.every} {out} || sleep 300",
        ""]))
    job_id = run_command(["sbatch", "--parsable", str(batch)]).stdout.strip().split(";")[0]
    node = ""
    try:
        if not wait_for(lambda: (out / "ckpt.pt").exists(), 300, poll_s=0.2):
            return {"recovered": False, "why": "no first checkpoint"}
        node = json.loads((out / "pid-1-0").read_text())["node"]
        crashed_at = time.time()
        run_command([str(CLUSTER), "node-crash", node], timeout_s=120)
        time.sleep(down_s)
        run_command([str(CLUSTER), "node-restore", node], timeout_s=300)
        node = ""
        return recovery(out, crashed_at, lambda s: s["restart"] > 0, 400)
    finally:
        if node:
            run_command([str(CLUSTER), "node-restore", node], timeout_s=300, check=False)
        run_command(["scancel", job_id], check=False)


# --- submitit's Checkpointable after a preemption -----------------------------------------------------


def checkpointable_trial(root: Path, trial: int, workload: Workload, partition: str) -> dict[str, Any]:
    """A submitit job whose callable is a ``Checkpointable`` (the plain loop, resumed from its file);
    preempted by SIGUSR2 after the first checkpoint: submitit checkpoints and requeues it."""
    import cloudpickle
    import submitit  # the project's pinned submitit

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job's Python does not see bench/
    out = root / f"checkpointable-{trial}"
    script = write_train_script(out, workload)
    executor = submitit.AutoExecutor(folder=out / "submitit", cluster="slurm")
    executor.update_parameters(slurm_partition=partition, nodes=1, tasks_per_node=1, timeout_min=20,
                               slurm_job_name=f"bench-checkpointable-{trial}")
    job = executor.submit(PlainLoop(script, workload, out))
    try:
        if not wait_for(lambda: (out / "ckpt.pt").exists(), 300, poll_s=0.2):
            return {"recovered": False, "why": "no first checkpoint"}
        signalled_at = time.time()
        run_command(["scancel", "--signal=USR2", job.job_id])
        return recovery(out, signalled_at, lambda s: s["restart"] > 0, 600)
    finally:
        run_command(["scancel", job.job_id], check=False)


class PlainLoop:
    """The plain loop as submitit's Checkpointable: ``checkpoint`` resubmits the same call (the loop
    resumes from its own file), which is what submitit's requeue-on-preemption needs."""

    def __init__(self, script: Path, workload: Workload, out: Path) -> None:
        self.script, self.workload, self.out = script, workload, out

    def __call__(self) -> int:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29790"}
        return subprocess.run([sys.executable, str(self.script), str(self.workload.steps), str(self.workload.every),
                               str(self.out)], env=env, check=True).returncode

    def checkpoint(self) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(PlainLoop(self.script, self.workload, self.out))
