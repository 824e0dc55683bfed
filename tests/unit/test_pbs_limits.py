"""Issue 22 item 6 on PBS: the limit of a user's queued jobs and of an array's subjobs, from the
server's and the job's queue's attributes as ``qmgr -c "list server"`` / ``list queue Q`` print them
(written from the PBS Professional 2022 and Torque 6 reference guides' formats: no real PBS server
runs here; under Slurm's wrappers the limits are Slurm's, drilled in tests/cluster)."""

from __future__ import annotations

import pytest

from orchestrator.backends.pbs import server
from orchestrator.backends.pbs.server import DEFAULT_MAX_ARRAY_SIZE, max_array_size, queued_limits
from orchestrator.commands import CommandResult

pytestmark = pytest.mark.unit

PRO_SERVER = """Server pbs01
\tserver_state = Active
\tscheduling = True
\tdefault_queue = workq
\tmax_queued = [o:PBS_ALL=2000],[u:PBS_GENERIC=20],[u:alice=50]
\tmax_array_size = 500
\tjob_history_enable = True
"""
PRO_QUEUE = """Queue workq
\tqueue_type = Execution
\tmax_queued = [u:PBS_GENERIC=8]
\tenabled = True
\tstarted = True
"""
TORQUE_SERVER = """Server torque01
    server_state = Active
    scheduling = True
    default_queue = batch
    max_job_array_size = 256
"""
TORQUE_QUEUE = """Queue batch
    queue_type = Execution
    max_user_queuable = 12
    enabled = True
"""


def test_max_queued_is_the_users_own_entry_over_the_generic_one_and_everyones_too() -> None:
    assert [(limit.jobs, limit.source) for limit in queued_limits(PRO_SERVER, "alice", "the server")] == [
        (50, "the server's max_queued (your)"), (2000, "the server's max_queued (everyone's jobs together)")]
    assert [limit.jobs for limit in queued_limits(PRO_SERVER, "bob", "the server")] == [20, 2000]
    assert [limit.jobs for limit in queued_limits(TORQUE_QUEUE, "bob", "queue batch")] == [12]
    assert queued_limits("Server s\n\tscheduling = True\n", "bob", "the server") == []
    assert queued_limits(None, "bob", "the server") == []


def test_an_arrays_subjobs_are_limited_by_the_servers_max_array_size() -> None:
    assert max_array_size(PRO_SERVER) == 500 and max_array_size(TORQUE_SERVER) == 256
    assert max_array_size("Server s\n") == DEFAULT_MAX_ARRAY_SIZE == max_array_size(None)


@pytest.mark.parametrize("answers, queue, expected", [
    ({"server": PRO_SERVER, "queue workq": PRO_QUEUE}, None, (8, "queue workq's max_queued (each user's)")),
    ({"server": PRO_SERVER, "queue gpu": ""}, "gpu", (20, "the server's max_queued (each user's)")),
    ({"server": TORQUE_SERVER, "queue batch": TORQUE_QUEUE}, None, (12, "queue batch's max_user_queuable")),
    ({}, None, None),  # qmgr does not answer (a site may not let users list it)
])
def test_the_fewest_queued_jobs_of_the_server_and_the_jobs_queue(monkeypatch, answers, queue, expected) -> None:
    def qmgr(args, **_kwargs):
        what = args[2].removeprefix("list ")
        if what not in answers:
            return CommandResult(tuple(args), 1, "", "qmgr: Unauthorized Request", 0.01)
        return CommandResult(tuple(args), 0, answers[what], "", 0.01)

    monkeypatch.setattr(server, "run_command", qmgr)
    found = server.max_queued("bob", queue)
    assert (found.jobs, found.source) == expected if expected else found is None, found
