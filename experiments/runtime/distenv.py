"""Who am I in this job: rank, world size and rendezvous address, from the scheduler's variables.

Sources, first match wins: submitit's local executor (``SUBMITIT_LOCAL_*``, it may run inside a
Slurm allocation, so it must shadow ``SLURM_*``), a Slurm step (``SLURM_PROCID``), a PBS job with
an MPI launcher (``PBS_JOBID`` with MPICH ``PMI_*`` or Open MPI ``OMPI_COMM_WORLD_*``), else a
single process. A rank that misreads its place waits forever at the rendezvous, so any
inconsistency is an error naming the variable at fault instead.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Mapping

from experiments.layout import (
    ENV_CHECKPOINT_TIMEOUT_S,
    ENV_COLLECTIVE_TIMEOUT_S,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RENDEZVOUS_TIMEOUT_S,
)
from experiments.runtime.hostlist import HostlistError, expand_hostlist

Scheduler = Literal["slurm", "local", "pbs", "single"]

# Below Linux's default ephemeral range (32768-60999) so that a derived port never collides with
# the source port of some outgoing connection on the master node.
PORT_BASE = 20000
PORT_SPAN = 12000
LOOPBACK = "127.0.0.1"


class DistEnvError(RuntimeError):
    """The scheduler's variables do not describe a consistent place for this rank."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str
    node: str
    scheduler: Scheduler

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, hostname: str | None = None
    ) -> "DistEnv":
        """Read the current process's environment (or a recorded one, for tests)."""
        env = os.environ if environ is None else environ
        return detect(env, hostname or socket.gethostname())


def derive_port(seed: str) -> int:
    """A port that differs between concurrent jobs (consecutive numeric ids never collide)."""
    if seed.isdigit():
        return PORT_BASE + int(seed) % PORT_SPAN
    digest = hashlib.sha256(seed.encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:8], "big") % PORT_SPAN


def detect(env: Mapping[str, str], hostname: str) -> DistEnv:
    """Build the DistEnv from whichever scheduler's variables are present; see the module doc."""
    if "SUBMITIT_LOCAL_GLOBALID" in env and "SUBMITIT_LOCAL_JOB_ID" in env:
        found, names, seed = _from_submitit_local(env, hostname)
    elif "SLURM_PROCID" in env and "SLURM_JOB_ID" in env:
        found, names, seed = _from_slurm(env, hostname)
    elif "PBS_JOBID" in env:
        found, names, seed = _from_pbs(env, hostname)
    else:
        found, names, seed = _single(hostname)
    found = _apply_overrides(found, seed, env)
    _validate(found, names)
    return found


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int | None = None) -> tuple[int, str]:
    """The first of ``names`` that is set, as an int, and which name it was (for error messages)."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            return int(raw), name
        except ValueError:
            raise DistEnvError(f"{name}={raw!r} is not an integer") from None
    if default is None:
        raise DistEnvError(f"none of {', '.join(names)} is set")
    return default, f"default {default} (none of {', '.join(names)} set)"


def _from_submitit_local(env: Mapping[str, str], hostname: str) -> tuple[DistEnv, dict[str, str], str]:
    rank, rank_var = _int(env, ("SUBMITIT_LOCAL_GLOBALID",))
    local_rank, local_var = _int(env, ("SUBMITIT_LOCAL_LOCALID",), default=rank)
    world, world_var = _int(env, ("SUBMITIT_LOCAL_NTASKS",), default=1)
    node_rank, node_var = _int(env, ("SUBMITIT_LOCAL_NODEID",), default=0)
    nodes, nodes_var = _int(env, ("SUBMITIT_LOCAL_JOB_NUM_NODES",), default=1)
    job_id = env["SUBMITIT_LOCAL_JOB_ID"]
    found = DistEnv(rank, local_rank, world, node_rank, nodes, LOOPBACK, 0, job_id, hostname, "local")
    names = {"rank": rank_var, "local_rank": local_var, "world_size": world_var,
             "node_rank": node_var, "num_nodes": nodes_var}
    return found, names, job_id


def _from_slurm(env: Mapping[str, str], hostname: str) -> tuple[DistEnv, dict[str, str], str]:
    rank, rank_var = _int(env, ("SLURM_PROCID",))
    # Step-scoped variables first: inside an srun step they describe the step, not the allocation.
    world, world_var = _int(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), default=1)
    local_rank, local_var = _int(env, ("SLURM_LOCALID",), default=0)
    node_rank, node_var = _int(env, ("SLURM_NODEID",), default=0)
    nodes, nodes_var = _int(env, ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"), default=1)
    nodelist_var = next(
        (n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), ""
    )
    hosts = _expand(env, nodelist_var) if nodelist_var else [hostname]
    if nodelist_var and len(dict.fromkeys(hosts)) != nodes:
        raise DistEnvError(
            f"{nodelist_var}={env[nodelist_var]!r} names {len(dict.fromkeys(hosts))} nodes "
            f"but {nodes_var}={nodes}"
        )
    raw_job = env["SLURM_JOB_ID"]
    # submitit names an array task "<array job>_<task>"; the injector compares against that name.
    job_id = raw_job
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    node = env.get("SLURMD_NODENAME") or hostname
    found = DistEnv(rank, local_rank, world, node_rank, nodes, hosts[0], 0, job_id, node, "slurm")
    names = {"rank": rank_var, "local_rank": local_var, "world_size": world_var,
             "node_rank": node_var, "num_nodes": nodes_var}
    return found, names, raw_job  # SLURM_JOB_ID is unique per array task too: the best port seed


def _expand(env: Mapping[str, str], variable: str) -> list[str]:
    try:
        hosts = expand_hostlist(env[variable])
    except HostlistError as error:
        raise DistEnvError(f"{variable}: {error}") from None
    if not hosts:
        raise DistEnvError(f"{variable}={env[variable]!r} names no host")
    return hosts


_MPI_RANK = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")
_MPI_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_MPI_LOCAL = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")


def _from_pbs(env: Mapping[str, str], hostname: str) -> tuple[DistEnv, dict[str, str], str]:
    rank, rank_var = _int(env, _MPI_RANK, default=0)
    world, world_var = _int(env, _MPI_SIZE, default=1)
    local_rank, local_var = _int(env, _MPI_LOCAL, default=0)
    hosts = _pbs_hosts(env, hostname)
    short = hostname.split(".")[0]
    short_hosts = [host.split(".")[0] for host in hosts]
    if short not in short_hosts:
        raise DistEnvError(f"this host {hostname!r} is not in PBS_NODEFILE ({', '.join(hosts)})")
    node_rank = short_hosts.index(short)
    job_id = env["PBS_JOBID"]
    found = DistEnv(rank, local_rank, world, node_rank, len(hosts), hosts[0], 0, job_id, hostname, "pbs")
    names = {"rank": rank_var, "local_rank": local_var, "world_size": world_var,
             "node_rank": "PBS_NODEFILE", "num_nodes": "PBS_NODEFILE"}
    return found, names, job_id


def _pbs_hosts(env: Mapping[str, str], hostname: str) -> list[str]:
    """Distinct hosts of PBS_NODEFILE in file order (the file lists one line per slot)."""
    nodefile = env.get("PBS_NODEFILE")
    if not nodefile:
        return [hostname]
    try:
        lines = Path(nodefile).read_text().split()
    except OSError as error:
        raise DistEnvError(f"PBS_NODEFILE={nodefile!r} cannot be read: {error}") from None
    hosts = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    if not hosts:
        raise DistEnvError(f"PBS_NODEFILE={nodefile!r} is empty")
    return hosts


def _single(hostname: str) -> tuple[DistEnv, dict[str, str], str]:
    job_id = f"pid-{os.getpid()}"
    found = DistEnv(0, 0, 1, 0, 1, LOOPBACK, 0, job_id, hostname, "single")
    return found, {}, job_id


def _apply_overrides(found: DistEnv, seed: str, env: Mapping[str, str]) -> DistEnv:
    port, _ = _int(env, (ENV_MASTER_PORT,), default=derive_port(seed))
    addr = env.get(ENV_MASTER_ADDR) or found.master_addr
    return replace(found, master_port=port, master_addr=addr)


def _validate(found: DistEnv, names: dict[str, str]) -> None:
    def name(field: str) -> str:
        return names.get(field, field)

    if found.world_size < 1:
        raise DistEnvError(f"{name('world_size')}={found.world_size}: world size must be >= 1")
    if not 0 <= found.rank < found.world_size:
        raise DistEnvError(
            f"{name('rank')}={found.rank} is outside 0..{found.world_size - 1} "
            f"({name('world_size')}={found.world_size})"
        )
    if not 0 <= found.local_rank < found.world_size:
        raise DistEnvError(f"{name('local_rank')}={found.local_rank} exceeds the world size {found.world_size}")
    if found.num_nodes < 1 or found.num_nodes > found.world_size:
        raise DistEnvError(
            f"{name('num_nodes')}={found.num_nodes} nodes for {name('world_size')}={found.world_size} ranks"
        )
    if not 0 <= found.node_rank < found.num_nodes:
        raise DistEnvError(f"{name('node_rank')}={found.node_rank} is outside 0..{found.num_nodes - 1}")
    if not 0 < found.master_port < 65536:
        raise DistEnvError(f"{ENV_MASTER_PORT}={found.master_port} is not a TCP port")


@dataclass(frozen=True)
class Timeouts:
    """How long a rank waits, in seconds, before it gives up on its peers.

    Separate values because they trade different things: ranks of one job may start tens of
    seconds apart (``rendezvous_s``); a peer that vanished without closing its sockets (a dead
    node) is only noticed after ``collective_s``, which bounds detection time; rank 0 may take
    long to write a large checkpoint while the others wait (``checkpoint_s``).
    """

    rendezvous_s: float = 300.0
    collective_s: float = 10.0
    checkpoint_s: float = 300.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "Timeouts":
        env = os.environ if environ is None else environ
        default = cls()
        return cls(
            rendezvous_s=_seconds(env, ENV_RENDEZVOUS_TIMEOUT_S, default.rendezvous_s),
            collective_s=_seconds(env, ENV_COLLECTIVE_TIMEOUT_S, default.collective_s),
            checkpoint_s=_seconds(env, ENV_CHECKPOINT_TIMEOUT_S, default.checkpoint_s),
        )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise DistEnvError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise DistEnvError(f"{name}={raw!r} must be positive")
    return value
