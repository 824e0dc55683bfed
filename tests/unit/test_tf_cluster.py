"""What the TensorFlow workload needs from the runtime, without TensorFlow: every rank's address
(TF_CONFIG's worker list) from recorded scheduler environments, and adopting files a framework
wrote by path into a checkpoint."""

from pathlib import Path

import pytest

from experiments.runtime.distenv import (
    PORT_BASE,
    PORT_SPAN,
    TASK_PORT_STRIDE,
    DistEnv,
    DistEnvError,
    expand_tasks_per_node,
    task_addresses,
    task_hosts,
    task_port,
)
from experiments.runtime.sink import FileSink

SLURM_2x2_RANK3 = {  # `srun -N2 -n4` on the local cluster, task 3 (second node)
    "SLURM_JOB_ID": "4182", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "fd-n[1-2]", "SLURM_STEP_NODELIST": "fd-n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "fd-n2",
}
LOCAL_RANK1 = {"SUBMITIT_LOCAL_JOB_ID": "52311", "SUBMITIT_LOCAL_GLOBALID": "1",
               "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2"}


def addresses(environ: dict[str, str], hostname: str = "h") -> list[str]:
    return task_addresses(DistEnv.from_environ(environ, hostname=hostname), environ)


def test_slurm_block_placement_one_port_per_task_on_a_node() -> None:
    port = PORT_BASE + 4182
    assert addresses(SLURM_2x2_RANK3) == [
        f"fd-n1:{port}", f"fd-n1:{port + TASK_PORT_STRIDE}", f"fd-n2:{port}", f"fd-n2:{port + TASK_PORT_STRIDE}"]


def test_slurm_keeps_slurm_node_order_not_name_order() -> None:
    # TensorFlow's SlurmClusterResolver sorts host names: n10 before n9. Slurm ranks 0-1 are on n9.
    recorded = {**SLURM_2x2_RANK3, "SLURM_STEP_NODELIST": "n[9-10]", "SLURM_JOB_NODELIST": "n[9-10]",
                "SLURMD_NODENAME": "n10"}
    assert task_hosts(DistEnv.from_environ(recorded, hostname="n10"), recorded) == ["n9", "n9", "n10", "n10"]


def test_slurm_uneven_tasks_per_node_and_explicit_port() -> None:
    recorded = {**SLURM_2x2_RANK3, "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "2,1", "FAULTDRILL_MASTER_PORT": "40000"}
    assert addresses(recorded) == ["fd-n1:40000", "fd-n1:40001", "fd-n2:40000"]


def test_slurm_cyclic_distribution_is_refused() -> None:
    # Under -m cyclic task 3 is the second task of fd-n2 only by accident; task 1 sits on fd-n2.
    recorded = {**SLURM_2x2_RANK3, "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
    with pytest.raises(DistEnvError, match="block distribution"):
        task_hosts(DistEnv.from_environ(recorded, hostname="fd-n2"), recorded)


def test_slurm_tasks_per_node_must_cover_the_world() -> None:
    recorded = {**SLURM_2x2_RANK3, "SLURM_STEP_TASKS_PER_NODE": "2,1"}
    with pytest.raises(DistEnvError, match="SLURM_STEP_TASKS_PER_NODE"):
        task_hosts(DistEnv.from_environ(recorded, hostname="fd-n2"), recorded)


def test_local_executor_ranks_share_loopback_with_spread_ports() -> None:
    port = PORT_BASE + 52311 % PORT_SPAN
    assert addresses(LOCAL_RANK1) == [f"127.0.0.1:{port}", f"127.0.0.1:{port + TASK_PORT_STRIDE}"]


def test_derived_ports_of_neighbouring_jobs_never_collide() -> None:
    # Local job ids are pids and Slurm ids are consecutive: master_port + slot would collide.
    used: dict[int, tuple[int, int]] = {}
    for job in range(5000, 5300):
        for slot in range(8):
            port = task_port(PORT_BASE + job % PORT_SPAN, slot, explicit=False)
            assert PORT_BASE <= port < PORT_BASE + PORT_SPAN
            assert used.setdefault(port, (job, slot)) == (job, slot)


def test_pbs_ranks_follow_the_nodefile_slots(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1\ncn1\ncn2\ncn2\n")
    recorded = {"PBS_JOBID": "991.pbs", "PBS_NODEFILE": str(nodefile), "PMI_RANK": "2", "PMI_SIZE": "4",
                "FAULTDRILL_MASTER_PORT": "30000"}
    assert addresses(recorded, hostname="cn2") == ["cn1:30000", "cn1:30001", "cn2:30000", "cn2:30001"]


def test_single_process() -> None:
    assert addresses({"FAULTDRILL_MASTER_PORT": "30000"}) == ["127.0.0.1:30000"]


def test_tasks_per_node_expressions() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(DistEnvError):
        expand_tasks_per_node("2(x)")


def test_adopt_renames_a_framework_file_into_the_checkpoint(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    with sink.scratch() as scratch:
        assert scratch.name.startswith(".")  # hidden: never hashed, never a payload
        (scratch / "ckpt.index").write_bytes(b"index")
        sink.adopt(scratch / "ckpt.index", "ckpt.index")
        (scratch / "left-over").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.index"]
    assert sink.written == {"ckpt.index": 5}
    with pytest.raises(ValueError):
        sink.adopt(tmp_path / "ckpt.index", "../escape")


# A rank that mpiexec started on the second node under Slurm's PBS wrappers (recorded on the local
# cluster): it sees only the Slurm step of the orted that started it, one task on fd-n2.
PBS_WRAPPERS_RANK2 = {
    "SLURM_JOB_ID": "301", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NODELIST": "fd-n2", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURMD_NODENAME": "fd-n2",
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "FAULTDRILL_MASTER_ADDR": "fd-n1", "FAULTDRILL_MASTER_PORT": "30000",
}


def _rank_hosts_from_the_pbs_script(tmp_path: Path, nodefile_lines: list[str], nodes: int, per_node: int) -> str:
    """Run the rendered PBS script's own lines that compute FAULTDRILL_RANK_HOSTS, for real."""
    import subprocess

    from orchestrator.render.scripts import PBSElement, PBSScriptRequest, render_template

    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"{line}\n" for line in nodefile_lines))
    request = PBSScriptRequest(job_name="t", nodes=nodes, tasks_per_node=per_node, walltime="00:01:00",
                               elements=(PBSElement(folder=tmp_path),), python="python", cpus_per_task=2)
    text = render_template("pbs.j2", request.context())
    snippet = text[text.index("rank_hosts=$("):text.index("export FAULTDRILL_RANK_HOSTS")]
    shown = subprocess.run(["bash", "-c", snippet + 'printf %s "$rank_hosts"'], capture_output=True, text=True,
                           check=True, env={"PBS_NODEFILE": str(nodefile), "PATH": "/usr/bin:/bin"})
    return shown.stdout


@pytest.mark.drill
def test_pbs_ranks_on_other_nodes_get_every_ranks_host_from_the_launch(tmp_path: Path) -> None:
    # Torque with ppn = tasks x cpus_per_task: one node file line per CPU, not per rank.
    lines = ["fd-n1"] * 4 + ["fd-n2"] * 4
    rank_hosts = _rank_hosts_from_the_pbs_script(tmp_path, lines, nodes=2, per_node=2)
    assert rank_hosts == "fd-n1,fd-n1,fd-n2,fd-n2"
    environ = {**PBS_WRAPPERS_RANK2, "FAULTDRILL_RANK_HOSTS": rank_hosts}
    assert addresses(environ, hostname="fd-n2") == ["fd-n1:30000", "fd-n1:30001", "fd-n2:30000", "fd-n2:30001"]
    with pytest.raises(DistEnvError, match="does not place 4 ranks"):
        addresses(PBS_WRAPPERS_RANK2, hostname="fd-n2")  # what the step variables alone say
