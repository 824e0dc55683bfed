"""The submitit PBS plugin: found through submitit's entry points, cheap to load in every job, and
a job environment that falls back clearly when a PBS variable is absent (Slurm's PBS wrappers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import submitit
from submitit.core import plugins

from orchestrator.backends.pbs.plugin import PBSExecutor, PBSJobEnvironment

SCHEDULER_VARIABLES = (
    "PBS_JOBID", "PBS_ARRAYID", "PBS_ARRAY_INDEX", "PBS_ARRAY_ID", "PBS_NODEFILE", "PBS_NUM_NODES", "PBS_NP",
    "PBS_VNODENUM", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALRANKID", "SUBMITIT_EXECUTOR",
)


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch):
    for name in SCHEDULER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_variables(**values: str) -> PBSJobEnvironment:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        return PBSJobEnvironment()

    return set_variables


@pytest.mark.drill
def test_registered_through_submitits_entry_points() -> None:
    assert plugins.get_executors()["pbs"] is PBSExecutor
    assert isinstance(plugins.get_job_environments()["pbs"], PBSJobEnvironment)


@pytest.mark.drill
def test_auto_executor_translates_generic_and_prefixed_parameters(tmp_path: Path) -> None:
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="pbs")
    executor.update_parameters(name="sweep", timeout_min=30, tasks_per_node=2, nodes=2, pbs_flavor="pro",
                               pbs_queue="debug")
    inner = executor._executor
    assert isinstance(inner, PBSExecutor)
    assert inner.parameters == {"job_name": "sweep", "timeout_min": 30, "tasks_per_node": 2, "nodes": 2,
                                "flavor": "pro", "queue": "debug"}


@pytest.mark.drill
def test_loading_the_plugin_in_a_job_stays_cheap() -> None:
    """submitit loads it in every rank of every backend: no pydantic, no spec, no templates."""
    code = ("import sys; import orchestrator.backends.pbs.plugin; "
            "print(sorted(m for m in ('pydantic', 'jinja2', 'yaml', 'orchestrator.campaign.runs', 'orchestrator.render.scripts') "
            "if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "[]"


def test_activated_only_in_a_pbs_submission(environ) -> None:
    assert not environ().activated()
    assert environ(SUBMITIT_EXECUTOR="pbs").activated()


def test_torque_job_with_mpi_ranks_and_a_node_file(environ, tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("node01\nnode01\nnode02\nnode02\n")
    env = environ(PBS_JOBID="1345.torque-srv", PBS_NODEFILE=str(nodefile), OMPI_COMM_WORLD_RANK="3",
                  OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="1")
    assert (env.job_id, env.raw_job_id, env.array_task_id, env.array_job_id) == ("1345.torque-srv",) * 2 + (None,) * 2
    assert (env.global_rank, env.local_rank, env.num_tasks) == (3, 1, 4)
    assert env.hostnames == ["node01", "node02"] and env.num_nodes == 2


def test_pro_array_element(environ) -> None:
    env = environ(PBS_JOBID="1030[4].pbs-srv", PBS_ARRAY_INDEX="4", PBS_ARRAY_ID="1030[].pbs-srv")
    assert (env.job_id, env.array_task_id, env.array_job_id) == ("1030[4].pbs-srv", "4", "1030[].pbs-srv")
    torque = environ(PBS_JOBID="1350[2].torque-srv", PBS_ARRAYID="2", PBS_ARRAY_INDEX="", PBS_ARRAY_ID="")
    assert (torque.array_task_id, torque.array_job_id) == ("2", "1350[].torque-srv")


def test_wrappers_fall_back_to_slurm_variables(environ) -> None:
    # Under slurm-wlm-torque, PBS_JOBID and PBS_NODEFILE exist but are empty.
    env = environ(PBS_JOBID="", PBS_NODEFILE="", SLURM_JOB_ID="73", SLURM_ARRAY_JOB_ID="69",
                  SLURM_ARRAY_TASK_ID="4", SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_NODELIST="fd-n[1-2]")
    assert (env.job_id, env.raw_job_id, env.array_job_id) == ("69[4]", "73", "69[]")
    assert (env.global_rank, env.num_tasks, env.hostnames) == (1, 2, ["fd-n1", "fd-n2"])


def test_unreadable_node_file_and_no_variables_fall_back(environ) -> None:
    env = environ(PBS_JOBID="7.srv", PBS_NODEFILE="/nonexistent/on/this/node")
    assert env.hostnames == [env.hostname] and env.num_tasks == 1 and env.global_rank == 0 and env.node == 0
    with pytest.raises(RuntimeError, match="neither PBS_JOBID nor SLURM_JOB_ID"):
        _ = environ(PBS_JOBID="").raw_job_id
