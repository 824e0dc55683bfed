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


# qsub's refusals as the manuals print them (PBS Pro 2022 Reference Guide, Torque 6 Administrator
# Guide), and as Slurm's Torque wrapper prints sbatch's (this machine's /usr/bin/qsub).
PRO_QUEUED = "qsub: would exceed queue workq's per-user limit of jobs in 'Q' state\n"
TORQUE_QUEUED = ("qsub: submit error (Maximum number of jobs already in queue for user MSG=total number of current "
                 "user's jobs exceeds the queue limit: user alice@login1, queue batch)\n")
PRO_WALLTIME = "qsub: Job violates queue and/or server resource limits\n"
TORQUE_WALLTIME = ("qsub: submit error (Job exceeds queue resource limits MSG=cannot satisfy queue max walltime "
                   "requirement)\n")
WRAPPED_LIMIT = ("There was an error running the Slurm sbatch command.\nThe command was:\n'/usr/bin/sbatch  -e x "
                 "job.sh  2>&1'\nand the output was:\n'sbatch: error: AssocMaxSubmitJobLimit\n sbatch: error: Batch "
                 "job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or "
                 "time limits)\n'\n")
NO_SERVER = "qsub: cannot connect to server pbs01 (errno=111) Connection refused\n"


@pytest.mark.parametrize(("stdout", "stderr", "held", "said"), [
    ("", PRO_QUEUED, True, "per-user limit of jobs"),
    ("", TORQUE_QUEUED, True, "Maximum number of jobs already in queue"),
    ("", PRO_WALLTIME, False, "resource limits"),
    ("", TORQUE_WALLTIME, False, "max walltime"),
    (WRAPPED_LIMIT, "", True, "AssocMaxSubmitJobLimit"),
    ("", NO_SERVER, None, ""),
    ("", "qsub: would exceed per-user limit on resource ncpus in queue workq\n", False, "limit on resource ncpus"),
])
def test_qsubs_refusals_are_held_for_a_limit_of_queued_jobs_and_final_for_a_job_refused_as_asked(
        stdout: str, stderr: str, held: bool | None, said: str) -> None:
    """Review of issue 22: the PBS backend had no refusal at all (a limit of queued jobs spent the
    submit retries, then restarts: the flood item 6 ends on Slurm)."""
    from orchestrator.backends.pbs.backend import PBSBackend
    from orchestrator.commands import CommandError

    refusal = PBSBackend.submit_refusal(object.__new__(PBSBackend),
                                        CommandError(["qsub", "job.pbs"], 1, stdout, stderr, "command failed"))
    if held is None:
        assert refusal is None
        return
    assert refusal is not None and refusal.held is held and said in refusal.why, refusal
    assert "There was an error" not in refusal.why and "The command was" not in refusal.why
