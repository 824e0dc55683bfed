"""Issue 27, item 1: a plain DDP script under torchrun, drilled as its user launches it
(``command: [torchrun, --nproc-per-node=2, train_ddp.py]``). The ranks are torchrun's workers: a
kill-rank hits a worker (not torchrun, whose workers trained on before), or, with ``process:
launcher``, torchrun itself; either way no process of the killed attempt outlives it, and the
report's resumed step and lost steps are what the script's own per-step log shows."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from drills import drill, write_spec

EVERY = 25
STEPS = 150
# Zero-code: it knows nothing of Faultdrill. torch.save every EVERY steps, load when the file exists
# (the imagenet example's idiom); every rank logs each step it ran with its pid.
SCRIPT = f"""
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
steps = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists("checkpoint.pt"):
    state = torch.load("checkpoint.pt")
    model.module.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
with open(f"steps-{{rank}}.log", "a") as log:
    for step in range(start + 1, steps + 1):
        generator = torch.Generator().manual_seed(step * 31 + rank)
        inputs = torch.randn(16, 8, generator=generator)
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        time.sleep(0.03)
        log.write(f"{{os.getpid()}} {{step}}\\n"); log.flush()
        if rank == 0:
            print(f"step {{step}}", flush=True)
            if step % {EVERY} == 0:
                torch.save({{"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}},
                           "checkpoint.tmp")
                os.replace("checkpoint.tmp", "checkpoint.pt")
dist.destroy_process_group()
"""


def _executed(log: Path) -> list[tuple[int, int]]:
    return [(int(pid), int(step)) for pid, step in (line.split() for line in log.read_text().splitlines())]


def _drill_torchrun(tmp_path: Path, fault: dict[str, object]) -> tuple[dict[str, object], Path]:
    (tmp_path / "train_ddp.py").write_text(SCRIPT)
    spec = write_spec(tmp_path, workload={"framework": "torch", "steps": STEPS,
                                          "command": ["torchrun", "--nproc-per-node=2", "train_ddp.py", "{steps}"],
                                          "progress": {"log": r"^step (\d+)"}},
                      resources={"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"}, faults=[fault])
    report = drill(spec, timeout=400)
    [run] = report["runs"]
    return run, tmp_path / "work" / "runs" / str(run["run_id"])


def _check_recovery(run: dict[str, object], run_dir: Path) -> None:
    """The report against the script's own log: resumed from the checkpoint the script wrote last
    before the kill, lost the steps rank 0 ran past it; none of the killed attempt's workers alive."""
    assert run["status"] == "completed", run
    executed = _executed(run_dir / "work" / "steps-0.log")
    killed_pids = {pid for pid, _ in executed[:1]} | {pid for pid, _ in _executed(run_dir / "work" / "steps-1.log")[:1]}
    first_pid = executed[0][0]
    last_before = max(step for pid, step in executed if pid == first_pid)
    own_checkpoint = last_before // EVERY * EVERY
    first_after = next(step for pid, step in executed if pid != first_pid)
    assert first_after == own_checkpoint + 1, (first_after, own_checkpoint)
    [recovery] = run["recoveries"]  # type: ignore[misc]
    assert recovery["resumed_from_step"] == own_checkpoint, recovery
    # Fewer only by the lines still in the pipe when the kill came (see test_own_script_cwd).
    assert last_before - own_checkpoint - 2 <= recovery["lost_steps"] <= last_before - own_checkpoint, (
        recovery, last_before)
    assert not [pid for pid in killed_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    identities = [json.loads(path.read_text()) for path in sorted((run_dir / "attempts" / "0").glob("rank-[0-9].json"))]
    assert sorted(identity["rank"] for identity in identities) == [0, 1]
    assert {identity["pid"] for identity in identities} == killed_pids, "the workers are the ranks"
    assert len({identity["launcher_pid"] for identity in identities}) == 1


def test_a_kill_of_a_torchrun_worker_is_a_kill_of_that_rank(tmp_path: Path) -> None:
    run, run_dir = _drill_torchrun(tmp_path, {"kind": "kill-rank", "after": {"at_step": 60}, "rank": 1})
    _check_recovery(run, run_dir)
    [fault] = run["faults"]  # type: ignore[misc]
    assert fault["target"].startswith("rank 1@") and fault["outcome"] == "injected", fault
    # torchrun exits 1 for its failed worker; the rank ends as that worker did: by SIGKILL.
    assert run["attempts"][0]["failure_class"] == "RANK_SIGNAL", run["attempts"]  # type: ignore[index]


def test_a_kill_of_torchrun_itself_ends_its_workers_with_it(tmp_path: Path) -> None:
    run, run_dir = _drill_torchrun(tmp_path, {"kind": "kill-rank", "after": {"at_step": 60}, "rank": 0,
                                              "process": "launcher"})
    _check_recovery(run, run_dir)
    [fault] = run["faults"]  # type: ignore[misc]
    assert "launcher" in fault["detail"] and fault["outcome"] == "injected", fault
    assert run["attempts"][0]["failure_class"] == "RANK_SIGNAL", run["attempts"]  # type: ignore[index]
