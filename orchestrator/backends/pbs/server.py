"""What a PBS server's configuration says (``qmgr -c "list server"``, ``list queue Q``): the queue a
job goes to, and the limit on how many jobs one user may have queued (pending and running; each
subjob of an array counts) — PBS Professional's ``max_queued`` (``[u:PBS_GENERIC=N]``, a user's own
``[u:NAME=N]`` over it, ``[o:PBS_ALL=N]`` for everyone's together) and ``max_user_queuable``
(Torque, older PBS), on the server and on the job's queue. Unknown (None) where qmgr does not
answer (a site may not let users list it): a submission past an unread limit is refused by
``qsub`` and held by the controller, as on Slurm."""

from __future__ import annotations

import re

from orchestrator.backends.base import SubmitLimit
from orchestrator.commands import CommandError, run_command

QMGR_TIMEOUT_S = 20.0
_DEFAULT_QUEUE = re.compile(r"^\s*default_queue\s*=\s*(\S+)", re.MULTILINE | re.IGNORECASE)
_MAX_QUEUED = re.compile(r"^\s*max_queued\s*=\s*(.+)$", re.MULTILINE | re.IGNORECASE)
_MAX_USER_QUEUABLE = re.compile(r"^\s*max_user_queuable\s*=\s*(\d+)", re.MULTILINE | re.IGNORECASE)
_MAX_ARRAY = re.compile(r"^\s*max_(?:job_)?array_size\s*=\s*(\d+)", re.MULTILINE | re.IGNORECASE)
DEFAULT_MAX_ARRAY_SIZE = 10000  # PBS Professional's default max_array_size (Torque sets none)
_ENTRY = re.compile(r"\[\s*([ugpo])\s*:\s*([^=\]\s]+)\s*=\s*(\d+)\s*\]")
GENERIC, EVERYONE = "PBS_GENERIC", "PBS_ALL"


def qmgr_list(what: str) -> str | None:
    """``qmgr -c "list <what>"``'s attributes (None where it does not answer)."""
    try:
        answered = run_command(["qmgr", "-c", f"list {what}"], timeout_s=QMGR_TIMEOUT_S, check=False)
    except CommandError:
        return None
    return answered.stdout if answered.returncode == 0 else None


def job_queue(queue: str | None, attributes: str | None) -> str | None:
    """The queue a job goes to: the one named, else the server's ``default_queue``."""
    match = _DEFAULT_QUEUE.search(attributes or "")
    return queue or (match.group(1) if match else None)


def queued_limits(attributes: str | None, user: str, where: str) -> list[SubmitLimit]:
    """The limits on ``user``'s queued jobs that ``attributes`` (one server's or queue's) set."""
    found = []
    if attributes and (match := _MAX_QUEUED.search(attributes)):
        entries = {(kind, name): int(count) for kind, name, count in _ENTRY.findall(match.group(1))}
        own = entries.get(("u", user), entries.get(("u", GENERIC)))
        if own is not None:
            whose = "your" if ("u", user) in entries else "each user's"
            found.append(SubmitLimit(own, f"{where}'s max_queued ({whose})"))
        if (everyone := entries.get(("o", EVERYONE))) is not None:
            found.append(SubmitLimit(everyone, f"{where}'s max_queued (everyone's jobs together)"))
    if attributes and (match := _MAX_USER_QUEUABLE.search(attributes)):
        found.append(SubmitLimit(int(match.group(1)), f"{where}'s max_user_queuable"))
    return found


def max_queued(user: str, queue: str | None) -> SubmitLimit | None:
    """The fewest jobs ``user`` may have queued at once, from the server's and the job's queue's
    attributes; None where none is set or qmgr does not answer."""
    server = qmgr_list("server")
    name = job_queue(queue, server)
    limits = queued_limits(server, user, "the server")
    if name is not None:
        limits += queued_limits(qmgr_list(f"queue {name}"), user, f"queue {name}")
    return min(limits, key=lambda limit: limit.jobs) if limits else None


def max_array_size(attributes: str | None) -> int:
    """The most subjobs an array may have: ``max_array_size`` (PBS Pro) or ``max_job_array_size``
    (Torque) of the server's attributes; PBS Professional's default where none is said."""
    match = _MAX_ARRAY.search(attributes or "")
    return int(match.group(1)) if match and int(match.group(1)) > 0 else DEFAULT_MAX_ARRAY_SIZE
