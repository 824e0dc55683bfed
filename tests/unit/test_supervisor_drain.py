"""Zero-code mode: a script's last step lines may still be in the pipe when it exits (a pipe holds
64 KiB, thousands of `step N` lines). The supervisor judges the script's end only once it has read
them all: on a loaded machine (CI) its reader fell more than 5 s behind, the run's completed last
attempt was taken for "the script exited 0 at step X of 3000" and run a third time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.drill  # it starts the supervisor's process and the script's

# The supervisor runs in a process of its own: it makes itself a subreaper and installs signal
# handlers, which the test process must not keep.
SUPERVISE = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from experiments.layout import CommandSpec, RankJob, WorkloadSpec, PROGRESS_LOG
    from experiments.runtime import command
    from experiments.runtime.distenv import DistEnv

    run_dir, steps, per_line_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    saw = command.InferredProgress.saw

    def slow_saw(self, step):  # the reader of a loaded machine: each line waits for the CPU
        time.sleep(per_line_s)
        saw(self, step)

    command.InferredProgress.saw = slow_saw
    script = f"for step in range(1, {steps} + 1): print(f'step {{step}} loss 0.1')"
    spec = CommandSpec(argv=(sys.executable, "-c", script), progress=PROGRESS_LOG, step_regex=r"^step (\\d+) ")
    job = RankJob(run_id="r0", run_dir=str(run_dir), attempt=0,
                  workload=WorkloadSpec(framework="other", steps=steps, command=spec),
                  checkpoint_every=0, checkpoint_keep=1)
    env = DistEnv(rank=0, local_rank=0, world_size=1, node_rank=0, num_nodes=1, master_addr="127.0.0.1",
                  master_port=29400, job_id="1", node="n0", scheduler="single")
    started = time.monotonic()
    try:
        print(json.dumps({"end": command.Supervisor(job, env, time.time()).run()}))
    except command.CommandFailed as error:
        print(json.dumps({"failed": str(error)}))
""")


def test_the_scripts_end_is_judged_after_its_last_step_line_is_read(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # 800 lines, each read 8 ms late: the reader is ~6.4 s behind the script when it exits.
    done = subprocess.run([sys.executable, "-c", SUPERVISE, str(run_dir), "800", "0.008"], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"end": {"rank": 0, "exit_code": 0}}
    assert json.loads((run_dir / "final.json").read_text())["step"] == 800
