"""The local test cluster itself (scripts/cluster): real Slurm, real accounting, real PBS
wrappers, four nodes in separate network namespaces. No mocks.

Run: scripts/cluster up && .venv/bin/python -m pytest tests/cluster/test_cluster.py -m cluster
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"

USABLE_NODE_STATES = {"idle", "mix", "alloc", "comp"}
# Generous deadlines: other tests may share the cluster, and the machine has 2 cores.
JOB_TIMEOUT = 90


def run(argv, *, timeout: float = 60, check: bool = True, cwd=None, env=None):
    """Run a command as an argument list (no shell), capturing text output."""
    argv = [os.fspath(a) for a in argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed (rc={proc.returncode}): {argv}\n"
                             f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    return proc


def _write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _python() -> str:
    """Interpreter for tasks: this test run's own (the repo's .venv), which the nodes see
    even when the repository lives under /tmp (scripts/cluster binds it in)."""
    return sys.executable


def test_status_reports_up():
    proc = run([CLUSTER_SCRIPT, "status"], check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cluster: up" in proc.stdout


def test_every_node_idle_or_allocatable(cluster):
    assert len(cluster) == 4 and len(set(cluster)) == 4, "scripts/cluster up makes 4 nodes by default"
    proc = run(["sinfo", "-h", "-N", "-p", cluster.partition, "-o", "%N %t %c"], timeout=15)
    seen = {}
    for line in proc.stdout.splitlines():
        name, state, cpus = line.split()
        seen[name] = (state, int(cpus))
    assert set(seen) == set(cluster), proc.stdout
    for name in cluster:
        state, cpus = seen[name]
        assert state in USABLE_NODE_STATES, f"{name} is {state}"
        assert cpus >= 4, f"{name} declares {cpus} CPUs"
    # The names resolve (via /etc/hosts) to the addresses the nodes registered with.
    for name in cluster:
        info = run(["scontrol", "show", "node", "-o", name], timeout=15).stdout
        assert f"NodeAddr={cluster.addresses[name]}" in info, info
        assert socket.gethostbyname(name) == cluster.addresses[name]


def test_two_node_batch_job_puts_ranks_on_both_nodes(cluster, slurm, shared_tmp):
    script = _write_script(
        shared_tmp / "job.sh",
        "#!/bin/bash\n"
        "srun bash -c 'echo \"rank=$SLURM_PROCID host=$(hostname)\"'\n",
    )
    out = shared_tmp / "out.txt"
    jobid = slurm.sbatch(
        "-N2", "--ntasks-per-node=2", "-J", "fd-spread", "-D", shared_tmp, "-o", out, script
    )
    assert slurm.wait_job_done(jobid, JOB_TIMEOUT) == "COMPLETED", out.read_text()
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("rank=")]
    ranks = {}
    for ln in lines:
        m = re.fullmatch(r"rank=(\d+) host=(\S+)", ln)
        assert m, ln
        ranks[int(m.group(1))] = m.group(2)
    assert sorted(ranks) == [0, 1, 2, 3], lines
    per_host = Counter(ranks.values())
    assert len(per_host) == 2 and set(per_host) <= set(cluster), per_host  # 2 of the cluster's nodes
    assert all(count == 2 for count in per_host.values()), per_host


def test_srun_python_across_nodes_has_distinct_hostnames(cluster, shared_tmp):
    code = (
        "import os, socket; "
        "print(os.environ['SLURM_PROCID'], socket.gethostname(), "
        "socket.gethostbyname(socket.gethostname()))"
    )
    proc = run(
        ["srun", "-N2", "-n2", "--ntasks-per-node=1", "-D", shared_tmp, _python(), "-c", code],
        timeout=JOB_TIMEOUT,
    )
    rows = sorted(line.split() for line in proc.stdout.splitlines() if line.strip())
    assert [r[0] for r in rows] == ["0", "1"], proc.stdout
    hosts = [r[1] for r in rows]
    assert len(set(hosts)) == 2 and set(hosts) <= set(cluster), proc.stdout
    for _, host, addr in rows:
        # Each node resolves its own name to its namespace address, not loopback.
        assert addr == cluster.addresses[host], proc.stdout


TCP_PAIR = r"""
import os, socket, sys, time
rank = int(os.environ["SLURM_PROCID"])
server, port = sys.argv[1], int(sys.argv[2])
host = socket.gethostname()
deadline = time.monotonic() + 30
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    s.settimeout(30)
    conn, peer = s.accept()
    data = conn.recv(200).decode()
    conn.sendall(f"pong from {host}".encode())
    conn.close()
    print(f"server {host} got [{data}] from {peer[0]}")
else:
    while True:
        try:
            c = socket.create_connection((server, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(f"ping from {host}".encode())
    print(f"client {host} got [{c.recv(200).decode()}]")
"""


def test_tcp_connection_from_second_node_to_listener_on_first(cluster, shared_tmp):
    first, second = cluster[0], cluster[1]
    script = shared_tmp / "tcp_pair.py"
    script.write_text(TCP_PAIR)
    port = random.randint(20000, 39999)
    proc = run(
        [
            "srun", "-N2", "-n2", "--ntasks-per-node=1", "-w", f"{first},{second}",
            "--kill-on-bad-exit=1", "-D", shared_tmp,
            _python(), script, first, str(port),
        ],
        timeout=JOB_TIMEOUT,
    )
    out = proc.stdout
    assert f"server {first} got [ping from {second}] from {cluster.addresses[second]}" in out, out
    assert f"client {second} got [pong from {first}]" in out, out


def test_each_node_has_a_private_tmp(cluster, shared_tmp):
    first, second = cluster[0], cluster[1]
    marker = f"/tmp/fd-private-tmp-{uuid.uuid4().hex}"
    try:
        run(["srun", "-N1", "-n1", "-w", first, "-D", shared_tmp, "touch", marker], timeout=JOB_TIMEOUT)
        on_first = run(["srun", "-N1", "-n1", "-w", first, "-D", shared_tmp, "ls", marker],
                       check=False, timeout=JOB_TIMEOUT)
        on_second = run(["srun", "-N1", "-n1", "-w", second, "-D", shared_tmp, "ls", marker],
                        check=False, timeout=JOB_TIMEOUT)
        assert on_first.returncode == 0, on_first.stderr
        assert on_second.returncode != 0, f"{marker} visible on {second}"
        assert not os.path.exists(marker), f"{marker} visible on the host"
    finally:
        run(["srun", "-N1", "-n1", "-w", first, "-D", shared_tmp, "rm", "-f", marker],
            check=False, timeout=JOB_TIMEOUT)


def test_sacct_shows_finished_jobs_state(slurm, shared_tmp):
    ok = slurm.sbatch("-N1", "-J", "fd-ok", "-D", shared_tmp, "-o", shared_tmp / "ok.out",
                      "--wrap", "true")
    bad = slurm.sbatch("-N1", "-J", "fd-bad", "-D", shared_tmp, "-o", shared_tmp / "bad.out",
                       "--wrap", "exit 3")
    # A job that starts and ends within a second can briefly show JobName "allocation" in
    # sacct before slurmdbd has the full record: wait for the name as well.
    rec_ok = slurm.wait_sacct_state(ok, JOB_TIMEOUT, name_prefix="fd-ok")
    rec_bad = slurm.wait_sacct_state(bad, JOB_TIMEOUT, name_prefix="fd-bad")
    assert rec_ok["State"] == "COMPLETED" and rec_ok["ExitCode"] == "0:0", rec_ok
    assert rec_ok["JobName"] == "fd-ok" and rec_ok["NodeList"], rec_ok
    assert rec_bad["State"] == "FAILED" and rec_bad["ExitCode"] == "3:0", rec_bad
    # The plain listing (as people type it) includes the job too.
    listing = run(["sacct", "-X", "-o", "JobID,State,NodeList", "-j", f"{ok},{bad}"], timeout=15)
    assert ok in listing.stdout and bad in listing.stdout, listing.stdout


def test_killed_rank_with_kill_on_bad_exit_fails_job_quickly(cluster, slurm, shared_tmp, wait_until):
    killed_at = shared_tmp / "killed_at"
    task = _write_script(
        shared_tmp / "task.sh",
        "#!/bin/bash\n"
        'if [ "$SLURM_PROCID" = 1 ]; then\n'
        f"  sleep 1; date +%s.%N > {killed_at}; kill -9 $$\n"
        "fi\n"
        "exec sleep 300\n",
    )
    jobid = slurm.sbatch(
        "-N2", "--ntasks-per-node=1", "-J", "fd-kill", "-D", shared_tmp,
        "-o", shared_tmp / "kill.out", "--wrap", f"srun --kill-on-bad-exit=1 {task}",
    )
    wait_until(lambda: killed_at.exists() and killed_at.read_text().strip(), JOB_TIMEOUT,
               message=f"rank 1 of job {jobid} to kill itself")
    t_kill = float(killed_at.read_text())
    state = slurm.wait_job_done(jobid, timeout=30)
    elapsed = time.time() - t_kill
    assert state == "FAILED", state
    assert elapsed < 20, f"job ended {elapsed:.1f}s after the rank was killed"
    rec = slurm.wait_sacct_state(jobid, 30)
    assert rec["State"] == "FAILED", rec


PBS_TWO_NODES = """#!/bin/bash
#PBS -N {name}
#PBS -l nodes=2:ppn=1
#PBS -l walltime=00:05:00
echo "nodelist=$SLURM_JOB_NODELIST"
srun hostname
"""


def test_qsub_two_nodes_runs_on_both_and_qstat_reports_it(cluster, slurm, shared_tmp):
    name = f"fdpbs{uuid.uuid4().hex[:6]}"
    script = _write_script(shared_tmp / "pbs_job.sh", PBS_TWO_NODES.format(name=name))
    out, err = shared_tmp / "pbs.out", shared_tmp / "pbs.err"
    # qsub passes its own -o/-e to sbatch, which beat #PBS -o/-e directives: give them here.
    proc = run(["qsub", "-o", out, "-e", err, script], cwd=shared_tmp, timeout=30)
    jobid = slurm.track(proc.stdout.strip().split(".")[0])
    assert jobid.isdigit(), proc.stdout

    full = run(["qstat", "-f", jobid], timeout=15).stdout
    assert re.search(rf"Job Id:\s*{jobid}\b", full), full
    assert f"Job_Name = {name}" in full, full
    assert re.search(r"job_state = [QRC]", full), full

    assert slurm.wait_job_done(jobid, JOB_TIMEOUT) == "COMPLETED", out.read_text() + err.read_text()
    hosts = [ln.strip() for ln in out.read_text().splitlines() if ln.strip() in cluster]
    assert len(set(hosts)) == 2 == len(hosts), out.read_text()
    info = slurm.job_info(jobid)
    assert sorted(slurm.hostnames(info["NodeList"])) == sorted(hosts), info
    done = run(["qstat", "-f", jobid], timeout=15).stdout
    assert "job_state = C" in done, done
    listing = run(["qstat"], timeout=15).stdout
    assert re.search(rf"^{jobid}\s+{name}\s", listing, re.M), listing


def test_qdel_cancels_a_running_pbs_job(slurm, shared_tmp, wait_until):
    script = _write_script(
        shared_tmp / "sleep.sh",
        "#!/bin/bash\n#PBS -N fdsleep\n#PBS -l nodes=1:ppn=1\nexec sleep 300\n",
    )
    proc = run(["qsub", "-o", shared_tmp / "s.out", "-e", shared_tmp / "s.err", script],
               cwd=shared_tmp, timeout=30)
    jobid = slurm.track(proc.stdout.strip().split(".")[0])

    def qstat_state():
        text = run(["qstat", "-f", jobid], check=False, timeout=15).stdout
        m = re.search(r"job_state = (\w)", text)
        return m.group(1) if m else None

    wait_until(lambda: qstat_state() == "R", JOB_TIMEOUT,
               message=lambda: f"qstat to show job {jobid} running (now {qstat_state()})")
    run(["qdel", jobid], timeout=30)
    # qstat shows C for COMPLETING as well as for the final state.
    wait_until(lambda: qstat_state() == "C", 30,
               message=lambda: f"qstat to show job {jobid} completed after qdel (now {qstat_state()})")
    assert slurm.wait_job_done(jobid, 30) == "CANCELLED"
    rec = slurm.wait_sacct_state(jobid, 30)
    assert rec["State"].startswith("CANCELLED"), rec


MPI_ALLREDUCE = """
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(f"rank={comm.rank} size={comm.size} host={socket.gethostname()} total={total}", flush=True)
"""


def _pmix_available() -> bool:
    proc = run(["srun", "--mpi=list"], check=False, timeout=15)
    return "pmix" in (proc.stdout + proc.stderr)


def _mpi4py_available() -> bool:
    proc = subprocess.run([_python(), "-c", "import mpi4py"], capture_output=True, timeout=60)
    return proc.returncode == 0


def test_mpi_over_pmix_across_nodes(cluster, shared_tmp):
    if not _pmix_available():
        pytest.skip("Slurm has no mpi/pmix plugin here")
    if not _mpi4py_available():
        pytest.skip(f"mpi4py is not importable by {_python()}")
    script = shared_tmp / "allreduce.py"
    script.write_text(MPI_ALLREDUCE)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = run(
        ["srun", "--mpi=pmix", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1",
         "-D", shared_tmp, _python(), script],
        env=env,
        timeout=JOB_TIMEOUT,
    )
    rows = re.findall(r"rank=(\d) size=(\d) host=(\S+) total=(\d+)", proc.stdout)
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3], proc.stdout + proc.stderr
    assert all(r[1] == "4" and r[3] == "10" for r in rows), proc.stdout
    per_host = Counter(r[2] for r in rows)
    assert len(per_host) == 2 and set(per_host) <= set(cluster) and set(per_host.values()) == {2}, proc.stdout
