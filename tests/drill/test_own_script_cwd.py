"""Issue 27, item 2: a script that checkpoints to a relative path and resumes whenever it finds
its checkpoint (as Chainer's snapshot(autoload=True) into ./result, the imagenet example's
checkpoint.pth.tar, HF's output_dir do) runs in a directory of its run's own. It shared the spec's
folder with its fault-free twin and resumed from the twin's checkpoint: a resume past the fault,
"0 lost", green. Now the run resumes from its own newest checkpoint, as its own step log shows."""

from __future__ import annotations

from pathlib import Path

from drills import drill, write_spec

EVERY = 20
SCRIPT = f"""
import json, os, sys, time
from pathlib import Path
steps = int(sys.argv[1])
checkpoint = Path("checkpoint.json")
start = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
with open("steps.log", "a") as log:
    for step in range(start + 1, steps + 1):
        time.sleep(0.02)
        log.write(f"{{os.getpid()}} {{step}}\\n"); log.flush()
        print(f"step {{step}}", flush=True)
        if step % {EVERY} == 0:
            Path("checkpoint.tmp").write_text(json.dumps({{"step": step}}))
            os.replace("checkpoint.tmp", checkpoint)
"""


def _executed(log: Path) -> list[tuple[int, int]]:
    """(pid, step) of every step the script ran, in order."""
    return [(int(pid), int(step)) for pid, step in (line.split() for line in log.read_text().splitlines())]


def test_a_script_that_resumes_from_a_relative_checkpoint_resumes_from_its_own(tmp_path: Path) -> None:
    (tmp_path / "train_relative.py").write_text(SCRIPT)
    spec = write_spec(tmp_path, baseline=True, parallel_runs=2,
                      workload={"framework": "torch", "steps": 300, "command": ["python", "train_relative.py", "{steps}"],
                                "progress": {"log": r"^step (\d+)"}},
                      resources={"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
                      faults=[{"kind": "kill-rank", "after": {"at_step": 90}, "rank": 0}])
    report = drill(spec, timeout=300)
    [run] = [run for run in report["runs"] if not run["is_baseline"]]
    [twin] = [run for run in report["runs"] if run["is_baseline"]]
    assert run["status"] == "completed" and twin["status"] == "completed"
    work = tmp_path / "work" / "runs"
    assert not (tmp_path / "steps.log").exists(), "the script ran in the spec's folder"
    executed = _executed(work / run["run_id"] / "work" / "steps.log")
    assert len(_executed(work / twin["run_id"] / "work" / "steps.log")) == 300, "the twin ran in a folder of its own"
    killed = executed[0][0]
    last_before = max(step for pid, step in executed if pid == killed)
    own_checkpoint = last_before // EVERY * EVERY
    first_after = next(step for pid, step in executed if pid != killed)
    assert first_after == own_checkpoint + 1, (first_after, own_checkpoint)
    [recovery] = run["recoveries"]
    assert recovery["resumed_from_step"] == own_checkpoint, recovery
    # Never more than the script lost; fewer by the lines still in the pipe when the kill came (seen
    # after the fault: zero-code mode's lost steps are inferred, issue 27 item 3 names it).
    assert 0 <= recovery["lost_steps"] <= last_before - own_checkpoint, (recovery, last_before)
