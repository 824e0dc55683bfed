"""Shared fixtures for the cluster tier: tests that run against the real local cluster.

The cluster is started by ``scripts/cluster up`` (four Slurm nodes, fd-n1 to fd-n4, each in
its own network namespace with a private /tmp; slurmdbd accounting; PBS/Torque wrappers).

Every test in this directory needs that cluster. When it is not up the tests are skipped
with the reason "cluster not up: run scripts/cluster up", unless FAULTDRILL_REQUIRE_CLUSTER=1
is set, in which case they fail (CI sets it after starting the cluster).

Fixtures for tests in this directory:

* ``cluster``     -> ClusterNodes: a tuple of the node names (``("fd-n1", ..., "fd-n4")``) with
                     ``.addresses`` (name -> IPv4), ``.controller``, ``.controller_address``,
                     ``.partition``, ``.node_iface`` and ``.state_dir``.
* ``shared_tmp``  -> pathlib.Path of a fresh per-test directory outside /tmp (the nodes have
                     a private /tmp), under /var/tmp/faultdrill-tests/, removed afterwards.
                     Use it as the job's work directory and for its outputs.
* ``slurm``       -> Slurm helper: ``run``, ``sbatch``, ``job_state``, ``wait_job_state``,
                     ``wait_job_done``, ``sacct_state``, ``wait_sacct_state``; jobs submitted
                     through it (or registered with ``slurm.track(jobid)``) that are still
                     queued or running at teardown are cancelled.
* ``wait_until``  -> the ``wait_until(predicate, timeout, ...)`` poll-with-deadline helper.

All scheduler commands run as argument lists (never through a shell), with timeouts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "cluster"
CLUSTER_STATE_DIR = Path("/var/lib/faultdrill-cluster")
DEFAULT_NODES = ("fd-n1", "fd-n2", "fd-n3", "fd-n4")
DEFAULT_ADDRESSES = {"fd-n1": "10.213.77.11", "fd-n2": "10.213.77.12", "fd-n3": "10.213.77.13", "fd-n4": "10.213.77.14"}
SHARED_TMP_ROOT = Path("/var/tmp/faultdrill-tests")
SKIP_REASON = "cluster not up: run scripts/cluster up"

# Slurm job states after which a job no longer runs.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)

T = TypeVar("T")


def require_cluster_enabled() -> bool:
    return os.environ.get("FAULTDRILL_REQUIRE_CLUSTER", "") == "1"


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value; return that value.

    Raises ``TimeoutError`` (with ``message``) once ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {text}")
        time.sleep(interval)


def run(
    argv: Iterable[str | os.PathLike],
    *,
    timeout: float = 60,
    check: bool = True,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run a command (argument list, no shell) capturing text output."""
    argv = [os.fspath(a) for a in argv]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed (rc={proc.returncode}): {argv}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


def _read_cluster_env() -> dict[str, str]:
    env_file = CLUSTER_STATE_DIR / "cluster.env"
    values: dict[str, str] = {}
    try:
        text = env_file.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.strip())
        if m:
            values[m.group(1)] = m.group(2).strip().strip('"')
    return values


class ClusterNodes(tuple):
    """The node names of the local cluster (a tuple), with a few facts attached."""

    addresses: dict[str, str]
    controller: str
    controller_address: str
    partition: str
    node_iface: str
    state_dir: Path

    def __new__(cls, names, **facts):
        obj = super().__new__(cls, names)
        for key, value in facts.items():
            setattr(obj, key, value)
        return obj


def load_cluster_nodes() -> ClusterNodes:
    env = _read_cluster_env()
    names = tuple(env.get("FAULTDRILL_CLUSTER_NODES", " ".join(DEFAULT_NODES)).split())
    addresses = {
        n: env.get(f"FAULTDRILL_CLUSTER_ADDR_{n.replace('-', '_')}", DEFAULT_ADDRESSES.get(n, ""))
        for n in names
    }
    return ClusterNodes(
        names,
        addresses=addresses,
        controller=env.get("FAULTDRILL_CLUSTER_CONTROLLER", "fd-ctl"),
        controller_address=env.get("FAULTDRILL_CLUSTER_CONTROLLER_ADDR", "10.213.77.1"),
        partition=env.get("FAULTDRILL_CLUSTER_PARTITION", "debug"),
        node_iface=env.get("FAULTDRILL_CLUSTER_NODE_IFACE", "eth0"),
        state_dir=CLUSTER_STATE_DIR,
    )


def cluster_up_status() -> tuple[bool, str]:
    """(is the cluster fully up, details) using ``scripts/cluster status``."""
    if shutil.which("sinfo") is None:
        return False, "Slurm client commands not installed (run scripts/install-deps)"
    if not CLUSTER_SCRIPT.exists():
        return False, f"{CLUSTER_SCRIPT} missing"
    try:
        proc = run([CLUSTER_SCRIPT, "status"], timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scripts/cluster status failed: {exc}"
    return proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ fixtures --------------


@pytest.fixture(scope="session")
def _cluster_up() -> tuple[bool, str]:
    return cluster_up_status()


@pytest.fixture(autouse=True)
def _require_cluster(_cluster_up):
    """Skip (or, with FAULTDRILL_REQUIRE_CLUSTER=1, fail) when the cluster is not up."""
    ok, details = _cluster_up
    if not ok:
        if require_cluster_enabled():
            pytest.fail(f"{SKIP_REASON} (FAULTDRILL_REQUIRE_CLUSTER=1)\n{details}", pytrace=False)
        pytest.skip(SKIP_REASON)


@pytest.fixture(scope="session")
def cluster(_cluster_up) -> ClusterNodes:
    """Node names of the running local cluster (tuple), with addresses etc. attached."""
    return load_cluster_nodes()


@pytest.fixture
def shared_tmp(request) -> Path:
    """A fresh directory outside /tmp, visible to every node; removed after the test."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]
    path = SHARED_TMP_ROOT / f"{safe}-{uuid.uuid4().hex[:8]}"
    assert not str(path.resolve()).startswith("/tmp/"), "job directories must live outside /tmp"
    path.mkdir(parents=True, mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Slurm:
    """Small helper around the Slurm client commands, with deadlines everywhere."""

    def __init__(self) -> None:
        self.jobs: list[str] = []

    run = staticmethod(run)

    def track(self, jobid: str) -> str:
        self.jobs.append(str(jobid))
        return str(jobid)

    def sbatch(self, *args: str | os.PathLike, cwd=None, env=None, timeout: float = 30) -> str:
        """Submit with ``sbatch --parsable ARGS``; return the job id (tracked)."""
        proc = run(["sbatch", "--parsable", *args], cwd=cwd, env=env, timeout=timeout)
        jobid = proc.stdout.strip().split(";")[0]
        assert jobid.isdigit(), f"unexpected sbatch output: {proc.stdout!r}"
        return self.track(jobid)

    def job_info(self, jobid: str) -> dict[str, str]:
        """Fields of ``scontrol show job -o`` (empty dict when the job is unknown)."""
        proc = run(["scontrol", "show", "job", "-o", str(jobid)], check=False, timeout=15)
        if proc.returncode != 0:
            return {}
        info: dict[str, str] = {}
        for token in proc.stdout.split():
            key, sep, value = token.partition("=")
            if sep and key not in info:
                info[key] = value
        return info

    def job_state(self, jobid: str) -> str | None:
        return self.job_info(jobid).get("JobState")

    def wait_job_state(self, jobid: str, states: Iterable[str], timeout: float = 60) -> str:
        wanted = set(states)

        def check():
            state = self.job_state(jobid)
            return state if state in wanted else None

        return wait_until(
            check,
            timeout,
            message=lambda: f"job {jobid} to reach {sorted(wanted)} (now {self.job_state(jobid)})",
        )

    def wait_job_done(self, jobid: str, timeout: float = 60) -> str:
        """Wait for a final state (COMPLETING is not one: qstat already shows it as C)."""
        return self.wait_job_state(jobid, TERMINAL_STATES, timeout)

    def sacct_state(self, jobid: str) -> dict[str, str] | None:
        """The allocation's accounting record (State, ExitCode, NodeList, ...) or None."""
        proc = run(
            ["sacct", "-n", "-X", "-P", "-j", str(jobid), "-o", "JobID,JobName,State,ExitCode,NodeList"],
            check=False,
            timeout=15,
        )
        if proc.returncode != 0:
            return None
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 5 and parts[0] == str(jobid):
                keys = ("JobID", "JobName", "State", "ExitCode", "NodeList")
                return dict(zip(keys, parts, strict=False))
        return None

    def wait_sacct_state(
        self, jobid: str, timeout: float = 60, name_prefix: str | None = None
    ) -> dict[str, str]:
        """Wait until accounting shows the job in a terminal state; return the record.

        With ``name_prefix``, also wait until the record's job name starts with it: a job that
        starts and ends within a second can show JobName "allocation" (and sometimes an early
        state) for a moment before slurmdbd has the complete record. Every check of a job's
        name goes through here, never through a record taken before the name arrived.
        """

        def check():
            rec = self.sacct_state(jobid)
            if not rec or rec["State"].split()[0] not in TERMINAL_STATES:
                return None
            if name_prefix is not None and not rec["JobName"].startswith(name_prefix):
                return None
            return rec

        return wait_until(
            check,
            timeout,
            message=lambda: f"sacct to show job {jobid} finished (now {self.sacct_state(jobid)})",
        )

    def hostnames(self, nodelist: str) -> list[str]:
        """Expand a Slurm node list expression (e.g. fd-n[1-2])."""
        proc = run(["scontrol", "show", "hostnames", nodelist], timeout=15)
        return proc.stdout.split()

    def cancel_tracked(self) -> None:
        live = [j for j in self.jobs if self.job_state(j) not in TERMINAL_STATES | {None}]
        if live:
            run(["scancel", *live], check=False, timeout=30)


@pytest.fixture
def slurm() -> Slurm:
    helper = Slurm()
    try:
        yield helper
    finally:
        helper.cancel_tracked()


@pytest.fixture(name="wait_until")
def wait_until_fixture():
    return wait_until


CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"


@pytest.fixture
def no_accounting() -> Iterator[None]:
    """The no-accounting profile: slurmdbd stopped (``scripts/cluster accounting off``), sacct failing."""
    subprocess.run([str(CLUSTER_SCRIPT), "accounting", "off"], check=True, capture_output=True, timeout=120)
    try:
        yield
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "accounting", "on"], check=True, capture_output=True, timeout=180)


@dataclass(frozen=True)
class PlainUser:
    """The user profile's ordinary user (scripts/cluster user on): its name and ids."""

    name: str
    uid: int
    gid: int

    def own(self, path: Path) -> Path:
        """``path``, a new directory, its own (only it may enter)."""
        path.mkdir()
        os.chown(path, self.uid, self.gid)
        path.chmod(0o700)
        return path


@pytest.fixture
def plain_user() -> Iterator[PlainUser]:
    """The user profile (``scripts/cluster user on``): fd-user, no root, known to accounting; removed after."""
    import pwd

    subprocess.run([str(CLUSTER_SCRIPT), "user", "on"], check=True, capture_output=True, timeout=60)
    try:
        entry = pwd.getpwnam("fd-user")
        yield PlainUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "user", "off"], check=True, capture_output=True, timeout=60)


# The limits profile (scripts/cluster LIMITS): what `limits on` sets.
SITE_LIMITS = {"MaxArraySize": 16, "MinJobAge": 10, "MaxSubmitJobs": 8}


@pytest.fixture
def site_limits() -> Iterator[dict[str, int]]:
    """The limits profile (``scripts/cluster limits on``): MaxArraySize 16, MinJobAge 10 s, limits
    enforced and MaxSubmitJobs 8 for this user; Slurm's defaults again after."""
    subprocess.run([str(CLUSTER_SCRIPT), "limits", "on"], check=True, capture_output=True, timeout=180)
    try:
        yield SITE_LIMITS
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "limits", "off"], check=True, capture_output=True, timeout=180)


def _cgroup_profile(state: str) -> None:
    """``scripts/cluster cgroup on|off`` once the queue is empty (it restarts every slurmd; an
    earlier test's jobs may still be ending)."""
    wait_until(lambda: subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=20).stdout == "",
               timeout=120, interval=0.5, message="the queue empty (the cgroup profile restarts the slurmds)")
    subprocess.run([str(CLUSTER_SCRIPT), "cgroup", state], check=True, capture_output=True, timeout=180)


@pytest.fixture
def memory_cgroup() -> Iterator[None]:
    """The cgroup profile (``scripts/cluster cgroup on``): Slurm's task/cgroup confines each job's
    memory to its request (ConstrainRAMSpace); no cgroups again after."""
    _cgroup_profile("on")
    try:
        yield
    finally:
        _cgroup_profile("off")


# The skew profile's offsets (scripts/cluster SKEW_OFFSETS): each node's clock minus the controller's.
# fd-n1 (rank 0's node in the drills) is more than preempt's 1 s slack behind: a warned checkpoint
# is found there only through the node's measured offset.
SKEW_OFFSETS = {"fd-n1": -1.6, "fd-n2": 1.3, "fd-n3": 0.5, "fd-n4": -0.3}


@pytest.fixture
def skewed_clocks() -> Iterator[dict[str, float]]:
    """The skew profile (``scripts/cluster skew on``): each job's tasks see their node's clock set
    off by libfaketime; its offsets."""
    subprocess.run([str(CLUSTER_SCRIPT), "skew", "on"], check=True, capture_output=True, timeout=60)
    try:
        yield SKEW_OFFSETS
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "skew", "off"], check=True, capture_output=True, timeout=60)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) that overlap at any moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most
