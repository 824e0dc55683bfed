"""Who am I in this job: rank, world size and rendezvous address, from the scheduler's variables.

Sources, first match wins: submitit's local executor (``SUBMITIT_LOCAL_*``, it may run inside a
Slurm allocation, so it must shadow ``SLURM_*``), a Slurm step (``SLURM_PROCID``), a PBS job with
an MPI launcher (``PBS_JOBID`` with MPICH ``PMI_*`` or Open MPI ``OMPI_COMM_WORLD_*``), else a
single process. Whichever it is, an MPI launcher's own variables (``OMPI_COMM_WORLD_*``, ``PMI_*``)
then set rank, world size and local rank, and a torchrun worker's (``TORCHELASTIC_RUN_ID`` with
``RANK``, ``GROUP_RANK``, ...) its whole place: ``mpiexec`` may run as the one task of submitit's local
executor or of a batch script, whose variables describe that one task, not the ranks. A rank that
misreads its place waits forever at the rendezvous, so any inconsistency is an error naming the
variable at fault instead.
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
    ENV_RANK_HOSTS,
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


# The variables that list the GPUs a process sees (NVIDIA's, AMD's): set per task by Slurm's
# --gpus-per-task / --gpu-bind and by PBS's cgroup hooks, to the task's own GPUs only.
VISIBLE_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def device_local_rank(environ: Mapping[str, str], local_rank: int) -> int:
    """The LOCAL_RANK a script passes to ``torch.cuda.set_device``: its index among the GPUs this
    task sees. With every GPU of the node visible to every task, its local rank; bound to its own
    (``--gpus-per-task`` with a per-task binding, Slurm 21.08 and later: the list names fewer GPUs
    than the local rank reaches), the matching one of its own: ``set_device(SLURM_LOCALID)`` failed
    on every rank but the node's first. MIG instances count as one (CUDA shows a process one)."""
    for name in VISIBLE_GPU_VARIABLES:
        listed = [device.strip() for device in environ.get(name, "").split(",") if device.strip()]
        if not listed or listed == ["NoDevFiles"]:
            continue
        visible = 1 if all(device.startswith("MIG-") for device in listed) else len(listed)
        return local_rank % visible if local_rank >= visible else local_rank
    return local_rank


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
    found, names, seed = _apply_mpi_launcher(found, names, seed, env)
    found = _apply_overrides(found, seed, env)
    found, names = _apply_torchrun(found, names, env)
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
    node = node_name(env, hostname)
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
# One name for all ranks of one MPI launch (Open MPI's mpiexec sets both; srun --mpi=pmix the first).
_MPI_LAUNCH = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")


def _apply_mpi_launcher(
    found: DistEnv, names: dict[str, str], seed: str, env: Mapping[str, str]
) -> tuple[DistEnv, dict[str, str], str]:
    """An MPI launcher's placement wins over the scheduler's (rank, world size, local rank).

    Job id, node count and master address stay the scheduler's: the fault injector matches the
    job id in the process environment. Under ``srun --mpi=pmix`` no size variable is set (only
    PMIX_RANK, equal to SLURM_PROCID), so Slurm's own variables stand.
    """
    if not any(env.get(name) for name in _MPI_SIZE):
        return found, names, seed
    rank, rank_var = _int(env, _MPI_RANK)
    world, world_var = _int(env, _MPI_SIZE)
    if any(env.get(name) for name in _MPI_LOCAL):
        local_rank, local_var = _int(env, _MPI_LOCAL)
    elif found.world_size == world:  # the scheduler started these very ranks (srun --mpi=pmi2)
        local_rank, local_var = found.local_rank, names.get("local_rank", "local_rank")
    else:
        raise DistEnvError(f"{world_var}={world} is set but none of {', '.join(_MPI_LOCAL)}")
    if found.scheduler == "single":
        # A bare mpiexec: each rank's pid-based job id differs, the launch's name does not.
        launch = next((env[name] for name in _MPI_LAUNCH if env.get(name)), "")
        if launch:
            seed = f"mpi-{launch}"
            found = replace(found, job_id=seed)
    found = replace(found, rank=rank, world_size=world, local_rank=local_rank)
    names = {**names, "rank": rank_var, "world_size": world_var, "local_rank": local_var}
    if found.num_nodes > world or not 0 <= found.node_rank < found.num_nodes:
        found, names = _launch_nodes(found, names, env)
    return found, names, seed


_MPI_LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _launch_nodes(found: DistEnv, names: dict[str, str], env: Mapping[str, str]) -> tuple[DistEnv, dict[str, str]]:
    """An MPI launch that holds fewer nodes than the allocation (a warm member: an mpiexec of one
    rank in a job of several nodes): its own nodes, its ranks placed ``local size`` per node."""
    if not any(env.get(name) for name in _MPI_LOCAL_SIZE):
        return found, names
    per_node, per_node_var = _int(env, _MPI_LOCAL_SIZE)
    if per_node < 1:
        raise DistEnvError(f"{per_node_var}={per_node}: ranks per node must be >= 1")
    nodes = -(-found.world_size // per_node)
    return (replace(found, node_rank=found.rank // per_node, num_nodes=nodes),
            {**names, "node_rank": f"rank // {per_node_var}", "num_nodes": f"world size / {per_node_var}"})


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


_TORCHRUN_WORKER = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR",
                    "MASTER_PORT")


def _apply_torchrun(found: DistEnv, names: dict[str, str], env: Mapping[str, str]) -> tuple[DistEnv, dict[str, str]]:
    """A worker torchrun started (workload.launcher torchrun): torchrun's placement wins over the
    task's (its node's torchrun), the rendezvous address included (the agent's store)."""
    if not all(env.get(name) for name in _TORCHRUN_WORKER):
        return found, names
    rank, rank_var = _int(env, ("RANK",))
    world, world_var = _int(env, ("WORLD_SIZE",))
    local_rank, local_var = _int(env, ("LOCAL_RANK",))
    node_rank, node_var = _int(env, ("GROUP_RANK",))
    port, _ = _int(env, ("MASTER_PORT",))
    found = replace(found, rank=rank, world_size=world, local_rank=local_rank, node_rank=node_rank,
                    master_addr=env["MASTER_ADDR"], master_port=port)
    return found, {**names, "rank": rank_var, "world_size": world_var, "local_rank": local_var, "node_rank": node_var}


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


# --- Every rank's address, for frameworks that listen on one port per rank (TensorFlow's gRPC
# workers): unlike a single rendezvous port, each rank needs the host and port of every other rank.

# Slots on one host get ports this far apart when the port was derived from the job id: job ids
# that are close (consecutive Slurm ids, local-executor pids) then never share a port, which a
# contiguous block (master_port + slot) would (job N's slot 1 is job N+1's slot 0).
TASK_PORT_STRIDE = 1009


def task_hosts(env: DistEnv, environ: Mapping[str, str] | None = None) -> list[str]:
    """The host of every rank, in rank order: from the launch that placed them when it says
    (FAULTDRILL_RANK_HOSTS, set by the PBS batch script for its mpiexec), else the scheduler's variables.

    Slurm: SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE (the job's when outside a step) with
    Slurm's default block distribution (ranks fill a node before the next one); the rank's own
    host and local id are checked against it, so a cyclic distribution fails here instead of
    binding a rank to another node's address. PBS: PBS_NODEFILE lists one line per slot and the MPI
    launcher maps rank r to line r (Open MPI and MPICH's default by-slot mapping). Local and single
    process: every rank on ``env.master_addr`` (loopback).
    """
    source = os.environ if environ is None else environ
    if source.get(ENV_RANK_HOSTS):
        hosts = _launcher_task_hosts(source[ENV_RANK_HOSTS], env.world_size)
        _check_own_slot(env, hosts, env.node, ENV_RANK_HOSTS)
        return hosts
    if env.scheduler == "slurm":
        hosts = _slurm_task_hosts(source, env.world_size)
        _check_own_slot(env, hosts, source.get("SLURMD_NODENAME"), "SLURM_STEP_TASKS_PER_NODE")
        return hosts
    if env.scheduler == "pbs":
        hosts = _pbs_task_hosts(source, env.world_size)
        _check_own_slot(env, hosts, env.node, "PBS_NODEFILE")
        return hosts
    return [env.master_addr] * env.world_size


def task_port(master_port: int, slot: int, explicit: bool) -> int:
    """The port of the ``slot``-th rank on a host: ``master_port`` for the first.

    ``explicit``: the port came from FAULTDRILL_MASTER_PORT, and whoever set it owns the block
    above it (master_port + slot); otherwise slots are TASK_PORT_STRIDE apart, wrapped into
    Faultdrill's port range.
    """
    if explicit:
        port = master_port + slot
        if port > 65535:
            raise DistEnvError(f"{ENV_MASTER_PORT}={master_port} leaves no port for slot {slot}")
        return port
    return PORT_BASE + (master_port - PORT_BASE + slot * TASK_PORT_STRIDE) % PORT_SPAN


def task_addresses(env: DistEnv, environ: Mapping[str, str] | None = None) -> list[str]:
    """``host:port`` of every rank in rank order; ranks sharing a host get distinct ports."""
    source = os.environ if environ is None else environ
    explicit = bool(source.get(ENV_MASTER_PORT))
    slots: dict[str, int] = {}
    addresses = []
    for host in task_hosts(env, source):
        slot = slots.get(host, 0)
        slots[host] = slot + 1
        addresses.append(f"{host}:{task_port(env.master_port, slot, explicit)}")
    return addresses


def expand_tasks_per_node(expression: str) -> list[int]:
    """Slurm's tasks-per-node list: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in expression.split(","):
        count, _, repeat = part.strip().partition("(x")
        if not count.isdigit() or (repeat and not (repeat.endswith(")") and repeat[:-1].isdigit())):
            raise DistEnvError(f"bad tasks-per-node list {expression!r}")
        counts.extend([int(count)] * (int(repeat[:-1]) if repeat else 1))
    return counts


def _slurm_task_hosts(env: Mapping[str, str], world_size: int) -> list[str]:
    nodelist_var = _first_set(env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    counts_var = _first_set(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if not nodelist_var or not counts_var:
        raise DistEnvError("per-rank hosts need SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE")
    nodes = list(dict.fromkeys(_expand(env, nodelist_var)))
    counts = expand_tasks_per_node(env[counts_var])
    if len(counts) != len(nodes) or sum(counts) != world_size:
        raise DistEnvError(
            f"{counts_var}={env[counts_var]!r} does not place {world_size} ranks on the "
            f"{len(nodes)} nodes of {nodelist_var}={env[nodelist_var]!r}"
        )
    # zip without strict=: the rank API runs on Python 3.9
    return [node for node, count in zip(nodes, counts) for _ in range(count)]  # noqa: B905 - lengths checked


def _launcher_task_hosts(text: str, world_size: int) -> list[str]:
    hosts = [host.strip() for host in text.split(",") if host.strip()]
    if len(hosts) != world_size:
        raise DistEnvError(f"{ENV_RANK_HOSTS} names {len(hosts)} hosts for {world_size} ranks: {text!r}")
    return hosts


def _pbs_task_hosts(env: Mapping[str, str], world_size: int) -> list[str]:
    nodefile = env.get("PBS_NODEFILE")
    if not nodefile:
        raise DistEnvError("per-rank hosts need PBS_NODEFILE")
    try:
        slots = Path(nodefile).read_text().split()
    except OSError as error:
        raise DistEnvError(f"PBS_NODEFILE={nodefile!r} cannot be read: {error}") from None
    if len(slots) < world_size:
        raise DistEnvError(f"PBS_NODEFILE={nodefile!r} lists {len(slots)} slots for {world_size} ranks")
    return slots[:world_size]


def _check_own_slot(env: DistEnv, hosts: list[str], own_host: str | None, source: str) -> None:
    """This rank's host and local id must be where the block mapping put it."""
    mapped = hosts[env.rank]
    local = hosts[: env.rank].count(mapped)
    if own_host and own_host.split(".")[0] != mapped.split(".")[0]:
        raise DistEnvError(
            f"rank {env.rank} runs on {own_host!r} but {source} with a block distribution puts it "
            f"on {mapped!r} (launch with the default block distribution)"
        )
    if env.scheduler == "slurm" and local != env.local_rank:
        raise DistEnvError(
            f"rank {env.rank} has SLURM_LOCALID={env.local_rank} but is slot {local} of {mapped!r} "
            "under a block distribution (launch with the default block distribution)"
        )


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    return next((name for name in names if env.get(name)), "")


def node_name(env: Mapping[str, str], hostname: str) -> str:
    """This node as the scheduler names it (Slurm's node name, else the host name): what the
    controller names when it reaches the node (srun --nodelist) and reads its clock by."""
    return env.get("SLURMD_NODENAME") or hostname
