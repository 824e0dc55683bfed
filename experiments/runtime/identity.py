"""Who this rank's process is, written at start so an injector can check a target before killing.

``start_ticks`` with the pid guards against pid reuse: an injector must see both match. It is the
kernel's own start time of the process (clock ticks since boot), which never changes; psutil's
``create_time`` adds the boot time as the wall clock gives it now, so two processes reading it while
NTP steps the clock (a fresh machine) disagree by a second or more. ``create_time`` is kept for people.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from experiments.layout import RankIdentity, RunPaths, record_dict, write_json_atomic
from experiments.runtime.distenv import DistEnv
from experiments.runtime.fault_requests import FAULT_SIGNAL, FaultRequests
from experiments.runtime.fence import own_job_id


def current_identity(env: DistEnv, attempt: int) -> RankIdentity:
    pid = os.getpid()
    return RankIdentity(
        rank=env.rank,
        pid=pid,
        create_time=created_at(pid),
        start_ticks=start_ticks(pid) or 0,
        host=socket.gethostname(),
        node=env.node,  # SLURMD_NODENAME under Slurm, else the host name
        job_id=own_job_id(env.job_id),  # as the controller names the job (an array element, a cluster)
        attempt=attempt,
    )


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of a live (not zombie) ``pid``; None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state is field 3, starttime field 22
    return None if fields[0] == "Z" else int(fields[19])


def created_at(pid: int) -> float:
    """When ``pid`` started, on the wall clock (for people: the check is ``start_ticks``): the boot
    time plus its start ticks; now where /proc does not say (the rank API needs no psutil)."""
    ticks = start_ticks(pid)
    try:
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else time.time()


def ticks_now() -> int:
    """Now, on the clock of ``start_ticks`` (clock ticks since boot): a process started later has
    more. psutil's create_time adds the boot time in whole seconds, so it cannot be set against
    time.time()."""
    return uptime_ticks(Path("/proc/uptime").read_text().split()[0], os.sysconf("SC_CLK_TCK"))


def uptime_ticks(uptime: str, ticks_per_s: int) -> int:
    """``/proc/uptime``'s seconds (two decimals) in whole clock ticks, exactly: as a float product,
    20000.06 s x 100 is 2000006.0000000002, one tick past a process started at 2000006."""
    return int(Decimal(uptime) * ticks_per_s)


def write_identity(paths: RunPaths, env: DistEnv, attempt: int) -> RankIdentity:
    identity = current_identity(env, attempt)
    write_json_atomic(paths.rank_file(attempt, env.rank), record_dict(identity))
    return identity


def register_rank(paths: RunPaths, env: DistEnv, attempt: int) -> RankIdentity:
    """This process becomes rank ``env.rank`` of ``attempt`` for the fault agent: its handler of the
    agent's requests (oom-rank, rank-error) for that attempt and rank first, then its identity (the
    agent acts only on a registered rank). A warm process registers again for every generation it
    trains in: each is an attempt of its own, and the agent asks the attempt's rank."""
    FaultRequests(paths.fault_request_file(attempt, env.rank)).install()
    return write_identity(paths, env, attempt)


def leave_attempt(paths: RunPaths, rank: int, attempt: int) -> None:
    """This warm process no longer serves rank ``rank`` of ``attempt`` (its generation ended): the
    agent's requests are not taken until it registers for the next, and its identity file of
    ``attempt`` says when it left, so that a fault still aimed at ``attempt`` (fired as the next
    generation formed) is refused as late instead of reaching the process that now serves the
    next one. Before the process tells the coordinator it is ready again: it can be in no later
    generation before this holds."""
    signal.signal(FAULT_SIGNAL, signal.SIG_IGN)
    path = paths.rank_file(attempt, rank)
    try:
        identity = RankIdentity(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return  # never registered: nothing can aim at it
    if identity.pid == os.getpid():
        write_json_atomic(path, record_dict(replace(identity, left_at=time.time())))


def matches_process(identity: RankIdentity) -> bool:
    """True when ``identity`` still names a live process on this host (pid not reused)."""
    if identity.host != socket.gethostname():
        return False
    return start_ticks(identity.pid) == identity.start_ticks
