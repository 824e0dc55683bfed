from pathlib import Path

import pytest

from experiments.runtime.distenv import PORT_BASE, PORT_SPAN, DistEnv, DistEnvError, Timeouts, derive_port

SLURM_RANK3 = {  # recorded from `srun -N2 -n4` on the local cluster, task 3 (second node)
    "SLURM_JOB_ID": "4182",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "fd-n[1-2]",
    "SLURM_STEP_NODELIST": "fd-n[1-2]",
    "SLURMD_NODENAME": "fd-n2",
}

LOCAL_RANK1 = {  # what submitit's LocalExecutor(tasks_per_node=2) sets for task 1
    "SUBMITIT_EXECUTOR": "local",
    "SUBMITIT_LOCAL_JOB_ID": "52311",
    "SUBMITIT_LOCAL_GLOBALID": "1",
    "SUBMITIT_LOCAL_LOCALID": "1",
    "SUBMITIT_LOCAL_NTASKS": "2",
    "SUBMITIT_LOCAL_NODEID": "0",
    "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
}


def test_slurm_multi_node() -> None:
    env = DistEnv.from_environ(SLURM_RANK3, hostname="host-x")
    assert env == DistEnv(
        rank=3, local_rank=1, world_size=4, node_rank=1, num_nodes=2, master_addr="fd-n1",
        master_port=PORT_BASE + 4182, job_id="4182", node="fd-n2", scheduler="slurm",
    )
    assert not env.is_main


def test_slurm_array_task_named_like_submitit_but_port_from_raw_id() -> None:
    recorded = {**SLURM_RANK3, "SLURM_ARRAY_JOB_ID": "4180", "SLURM_ARRAY_TASK_ID": "2"}
    env = DistEnv.from_environ(recorded, hostname="h")
    assert env.job_id == "4180_2"
    assert env.master_port == PORT_BASE + 4182


def test_slurm_job_nodelist_when_no_step_variables() -> None:
    recorded = {k: v for k, v in SLURM_RANK3.items() if not k.startswith("SLURM_STEP")}
    recorded["SLURM_JOB_NODELIST"] = "gpu[07-08]"
    assert DistEnv.from_environ(recorded, hostname="h").master_addr == "gpu07"


def test_submitit_local_shadows_an_enclosing_slurm_allocation() -> None:
    env = DistEnv.from_environ({**SLURM_RANK3, **LOCAL_RANK1}, hostname="login1")
    assert (env.scheduler, env.rank, env.world_size, env.master_addr) == ("local", 1, 2, "127.0.0.1")
    assert env.job_id == "52311" and env.node == "login1"


def test_single_process_fallback() -> None:
    env = DistEnv.from_environ({}, hostname="laptop")
    assert (env.scheduler, env.rank, env.world_size, env.num_nodes) == ("single", 0, 1, 1)
    assert env.is_main


def test_pbs_with_mpich(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1.cluster\ncn1.cluster\ncn2.cluster\ncn2.cluster\n")
    recorded = {"PBS_JOBID": "991.pbs-server", "PBS_NODEFILE": str(nodefile),
                "PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}
    env = DistEnv.from_environ(recorded, hostname="cn2")
    assert (env.scheduler, env.rank, env.world_size, env.node_rank, env.num_nodes) == ("pbs", 2, 4, 1, 2)
    assert env.master_addr == "cn1.cluster" and env.job_id == "991.pbs-server"
    assert PORT_BASE <= env.master_port < PORT_BASE + PORT_SPAN


@pytest.mark.parametrize("scheduler_variables, hostname", [
    # Slurm's Torque wrappers: a member mpiexec started on the batch node sees the allocation's 2 nodes.
    ({"SLURM_JOB_ID": "855", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
      "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "fd-n[1-2]"}, "fd-n1"),
    # PBS: a member on the second node of the node file.
    ({"PBS_JOBID": "991.pbs-server", "PBS_NODEFILE": "{nodefile}"}, "cn2"),
])
def test_a_warm_member_is_an_mpi_launch_of_one_rank_on_one_node(tmp_path: Path, scheduler_variables: dict[str, str],
                                                                 hostname: str) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1\ncn1\ncn2\ncn2\n")
    recorded = {name: value.format(nodefile=nodefile) for name, value in scheduler_variables.items()}
    recorded.update({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                     "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    env = DistEnv.from_environ(recorded, hostname=hostname)
    assert (env.rank, env.world_size, env.node_rank, env.num_nodes, env.node) == (0, 1, 0, 1, hostname)


def test_pbs_host_missing_from_nodefile(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1\n")
    with pytest.raises(DistEnvError, match="PBS_NODEFILE"):
        DistEnv.from_environ({"PBS_JOBID": "1", "PBS_NODEFILE": str(nodefile)}, hostname="cn9")


def test_overrides() -> None:
    recorded = {**LOCAL_RANK1, "FAULTDRILL_MASTER_PORT": "29500", "FAULTDRILL_MASTER_ADDR": "10.0.0.1"}
    env = DistEnv.from_environ(recorded, hostname="h")
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29500)


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NODELIST"),
        ({"SLURM_STEP_NODELIST": "fd-n[1-2"}, "SLURM_STEP_NODELIST"),
        ({"SLURM_STEP_NUM_TASKS": "0", "SLURM_PROCID": "0"}, "SLURM_STEP_NUM_TASKS"),
        ({"FAULTDRILL_MASTER_PORT": "70000"}, "FAULTDRILL_MASTER_PORT"),
    ],
)
def test_inconsistent_environment_names_the_variable(change: dict[str, str], variable: str) -> None:
    with pytest.raises(DistEnvError, match=variable):
        DistEnv.from_environ({**SLURM_RANK3, **change}, hostname="h")


def test_local_rank_beyond_world() -> None:
    with pytest.raises(DistEnvError, match="SUBMITIT_LOCAL_GLOBALID"):
        DistEnv.from_environ({**LOCAL_RANK1, "SUBMITIT_LOCAL_GLOBALID": "2"}, hostname="h")


def test_derived_ports_differ_for_concurrent_jobs() -> None:
    assert derive_port("1000") != derive_port("1001")
    assert derive_port("abc") == derive_port("abc")
    assert all(PORT_BASE <= derive_port(seed) < PORT_BASE + PORT_SPAN for seed in ["0", "99999999", "a.b"])


def test_timeouts_from_environ() -> None:
    assert Timeouts.from_environ({}) == Timeouts()
    assert Timeouts.from_environ({"FAULTDRILL_COLLECTIVE_TIMEOUT_S": "2.5"}).collective_s == 2.5
    with pytest.raises(DistEnvError, match="FAULTDRILL_RENDEZVOUS_TIMEOUT_S"):
        Timeouts.from_environ({"FAULTDRILL_RENDEZVOUS_TIMEOUT_S": "-1"})


# Recorded from `mpiexec -n 2 --oversubscribe --bind-to none` (Open MPI 4.1.4) started as the one
# task of submitit's local executor: every rank also carries the executor's "task 0 of 1".
MPIEXEC_UNDER_LOCAL_RANK1 = {
    "SUBMITIT_LOCAL_JOB_ID": "777",
    "SUBMITIT_LOCAL_GLOBALID": "0",
    "SUBMITIT_LOCAL_NTASKS": "1",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_MCA_ess_base_jobid": "126287873",
    "PMIX_NAMESPACE": "126287873",
    "PMIX_RANK": "1",
}


def test_mpiexec_ranks_win_over_submitit_local_single_task() -> None:
    env = DistEnv.from_environ(MPIEXEC_UNDER_LOCAL_RANK1, hostname="vm")
    assert (env.rank, env.local_rank, env.world_size, env.num_nodes) == (1, 1, 2, 1)
    # The injector matches the scheduler's job id; the rendezvous stays on loopback.
    assert (env.scheduler, env.job_id, env.master_addr) == ("local", "777", "127.0.0.1")
    assert env.master_port == PORT_BASE + 777
    rank0 = {**MPIEXEC_UNDER_LOCAL_RANK1, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    assert DistEnv.from_environ(rank0, hostname="vm").is_main


def test_mpiexec_inside_a_slurm_batch_script_wins_over_the_batch_step() -> None:
    # The batch step's SLURM_PROCID/NTASKS describe the script, not the ranks mpiexec starts.
    batch = {**SLURM_RANK3, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
             "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    batch = {k: v for k, v in batch.items() if not k.startswith("SLURM_STEP")}
    env = DistEnv.from_environ(batch, hostname="fd-n1")
    assert (env.scheduler, env.rank, env.world_size, env.local_rank) == ("slurm", 3, 4, 1)
    assert (env.job_id, env.master_addr) == ("4182", "fd-n1")


def test_srun_pmix_keeps_slurm_placement() -> None:
    # Recorded from `srun -N2 -n2 --mpi=pmix` on the local cluster: PMIX_RANK (= SLURM_PROCID) and
    # PMIX_NAMESPACE, no size variable (Open MPI sets OMPI_COMM_WORLD_* only inside MPI_Init).
    env = DistEnv.from_environ({**SLURM_RANK3, "PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.4182.0"}, hostname="h")
    assert (env.scheduler, env.rank, env.world_size, env.job_id) == ("slurm", 3, 4, "4182")


def test_bare_mpiexec_names_the_job_after_the_launch() -> None:
    recorded = {k: v for k, v in MPIEXEC_UNDER_LOCAL_RANK1.items() if not k.startswith("SUBMITIT")}
    env = DistEnv.from_environ(recorded, hostname="vm")
    assert (env.scheduler, env.rank, env.world_size, env.job_id) == ("single", 1, 2, "mpi-126287873")


def test_mpi_rank_beyond_world_names_the_mpi_variable() -> None:
    with pytest.raises(DistEnvError, match="OMPI_COMM_WORLD_RANK"):
        DistEnv.from_environ({**MPIEXEC_UNDER_LOCAL_RANK1, "OMPI_COMM_WORLD_RANK": "2"}, hostname="vm")


def test_uptime_is_counted_in_whole_ticks_exactly() -> None:
    """A process's start and "now" compare tick for tick (a kill spares what started in its tick)."""
    from experiments.runtime.identity import uptime_ticks

    assert 20000.06 * 100 != 2000006  # the float product the clock once was
    assert uptime_ticks("20000.06", 100) == 2000006 and uptime_ticks("0.07", 100) == 7
    assert uptime_ticks("1234.5", 250) == 308625
