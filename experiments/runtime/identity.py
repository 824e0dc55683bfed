"""Who this rank's process is, written at start so an injector can check a target before killing.

``create_time`` with the pid guards against pid reuse: an injector must see both match.
"""

from __future__ import annotations

import os
import socket

import psutil

from experiments.layout import RankIdentity, RunPaths, record_dict, write_json_atomic
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fence import own_job_id


def current_identity(env: DistEnv, attempt: int) -> RankIdentity:
    pid = os.getpid()
    return RankIdentity(
        rank=env.rank,
        pid=pid,
        create_time=psutil.Process(pid).create_time(),
        host=socket.gethostname(),
        node=env.node,  # SLURMD_NODENAME under Slurm, else the host name
        job_id=own_job_id(env.job_id),  # as the controller names the job (an array element, a cluster)
        attempt=attempt,
    )


def write_identity(paths: RunPaths, env: DistEnv, attempt: int) -> RankIdentity:
    identity = current_identity(env, attempt)
    write_json_atomic(paths.rank_file(attempt, env.rank), record_dict(identity))
    return identity


def matches_process(identity: RankIdentity) -> bool:
    """True when ``identity`` still names a live process on this host (pid not reused)."""
    if identity.host != socket.gethostname():
        return False
    try:
        return psutil.Process(identity.pid).create_time() == identity.create_time
    except psutil.NoSuchProcess:
        return False
