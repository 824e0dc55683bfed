"""oom-rank on cgroup v2: the job's memory limit and the OOM killer's count read from v2's files, in
the layout Slurm's cgroup/v2 plugin makes (``system.slice/slurmstepd.scope/job_N/step_M/user/
task_K``, the limit on the job's and the step's cgroups). This machine mounts its memory
controller as v1, so the v2 tree is recorded: the files and values as the kernel's cgroup-v2 docs
and Slurm's plugin write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from injectors import memory_cgroup
from injectors.targets import TargetRefused

pytestmark = pytest.mark.unit

MB = 1 << 20
STEP = "system.slice/slurmstepd.scope/job_7/step_0"
TASK = f"{STEP}/user/task_0"
EVENTS_AFTER_KILL = "low 0\nhigh 0\nmax 41\noom 1\noom_kill 1\noom_group_kill 0\n"


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A v2-only node: one cgroup2 mount offering memory, a rank (pid 4242) in a Slurm task cgroup
    under a 512 MB job limit (the step's the same, the user's and the task's none)."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    mounts = tmp_path / "mounts"
    mounts.write_text(f"proc /proc proc rw 0 0\ncgroup2 {root} cgroup2 rw,nosuid,nodev,noexec 0 0\n")
    _write(root, {"cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n"})
    _write(root / "system.slice", {"memory.max": "max\n", "memory.current": f"{900 * MB}\n"})
    _write(root / "system.slice/slurmstepd.scope", {"memory.max": "max\n", "memory.current": f"{400 * MB}\n"})
    _write(root / "system.slice/slurmstepd.scope/job_7",
           {"memory.max": f"{512 * MB}\n", "memory.current": f"{300 * MB}\n", "memory.peak": f"{310 * MB}\n"})
    _write(root / STEP, {"memory.max": f"{512 * MB}\n", "memory.current": f"{290 * MB}\n"})
    _write(root / f"{STEP}/user", {"memory.max": "max\n", "memory.current": f"{290 * MB}\n"})
    _write(root / TASK, {"memory.max": "max\n", "memory.current": f"{290 * MB}\n",
                         "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"})
    _write(proc / "4242", {"cgroup": f"0::/{TASK}\n"})
    _write(proc, {"meminfo": f"MemTotal:       {16 << 20} kB\nMemFree:        {8 << 20} kB\n"})
    monkeypatch.setattr(memory_cgroup, "MOUNTS", mounts)
    monkeypatch.setattr(memory_cgroup, "PROC", proc)
    return root


def test_on_v2_the_tightest_limit_is_the_jobs_and_its_peak_and_kill_count_are_read(node: Path) -> None:
    assert memory_cgroup.memory_controller() == memory_cgroup.MemoryController(node, 2)
    assert memory_cgroup.own_memory_cgroup(4242) == node / TASK
    limit = memory_cgroup.job_memory_limit(4242)
    assert limit is not None
    # the job's room (212 MB) is less than the step's (222 MB): the job's limit is the one the rank meets
    assert limit.directory == node / "system.slice/slurmstepd.scope/job_7", limit
    assert (limit.limit_bytes, limit.usage_bytes) == (512 * MB, 300 * MB)
    assert limit.peak_bytes() == 310 * MB
    assert memory_cgroup.oom_kill_count(node / TASK) == 0
    (node / TASK / "memory.events").write_text(EVENTS_AFTER_KILL)
    assert memory_cgroup.oom_kill_count(node / TASK) == 1


def test_on_v2_before_linux_5_19_there_is_no_peak_and_a_job_without_a_limit_has_none(node: Path) -> None:
    job = node / "system.slice/slurmstepd.scope/job_7"
    (job / "memory.peak").unlink()
    limit = memory_cgroup.job_memory_limit(4242)
    assert limit is not None and limit.peak_bytes() is None, "no peak file: the kill count is the evidence"
    for directory in (job, node / STEP):
        (directory / "memory.max").write_text("max\n")
    assert memory_cgroup.job_memory_limit(4242) is None


def test_on_v2_the_agents_own_cap_is_refused_naming_limit_job(node: Path) -> None:
    with pytest.raises(TargetRefused, match="limit: job"):
        memory_cgroup.memory_root()


def test_a_hybrid_node_reads_v1s_memory_controller_and_a_v2_mount_without_memory_is_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unified, v1 = tmp_path / "unified", tmp_path / "memory"
    _write(unified, {"cgroup.controllers": ""})
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {unified} cgroup2 rw 0 0\ncgroup {v1} cgroup rw,nosuid,memory 0 0\n")
    monkeypatch.setattr(memory_cgroup, "MOUNTS", mounts)
    assert memory_cgroup.memory_controller() == memory_cgroup.MemoryController(v1, 1)
    mounts.write_text(f"cgroup2 {unified} cgroup2 rw 0 0\n")
    with pytest.raises(TargetRefused, match="no memory controller"):
        memory_cgroup.memory_controller()


def test_on_v2_the_agents_own_cap_as_root_is_refused_not_a_crash(node: Path) -> None:
    """Second review of issue 22: MemoryCap.create reached v1's files on a v2 node (a PermissionError
    from kernfs, no verdict from the agent); it is refused naming limit: job, and makes no cgroup."""
    before = sorted(path for path in node.rglob("*") if path.is_dir())
    with pytest.raises(TargetRefused, match="limit: job"):
        memory_cgroup.MemoryCap.create(4242, "faultdrill-oom-x", 64 << 20)
    assert sorted(path for path in node.rglob("*") if path.is_dir()) == before


def test_a_kill_whose_cgroup_went_with_its_step_is_told_by_the_nodes_count(node: Path) -> None:
    """CI on a loaded host (cgroup v1): the job's cgroup had peaked at its limit in the rank's start-up
    (page cache) and Slurm removed the rank's task cgroup with its step before the agent's next look,
    so neither the peak nor the rank's own count could tell the OOM killer's kill: the node's count in
    /proc/vmstat, which only the OOM killer moves, still does. Without a rise, nothing is claimed."""
    from injectors.kinds.oom_rank import _OomWatch

    job = node / "system.slice/slurmstepd.scope/job_7"
    (job / "memory.peak").write_text(f"{512 * MB}\n")
    (node.parent / "proc" / "vmstat").write_text("nr_free_pages 1000\noom_kill 34\nnuma_hit 7\n")
    limit = memory_cgroup.job_memory_limit(4242)
    assert limit is not None
    watch = _OomWatch.before(4242, limit)
    for name in ("memory.events", "memory.max", "memory.current"):
        (node / TASK / name).unlink()
    (node / TASK).rmdir()
    assert watch.evidence() is None
    (node.parent / "proc" / "vmstat").write_text("nr_free_pages 1000\noom_kill 35\nnuma_hit 7\n")
    assert watch.evidence() == ("the node's OOM-kill count (/proc/vmstat) rose by 1 while it grew; its own cgroup "
                                "went with its step before its count was read, the job's cgroup at its limit")
    assert watch.evidence(node_claimants=2) is None, "one kill on the node told for two ranks"


def test_the_nodes_count_tells_nothing_where_the_ranks_cgroup_or_the_jobs_peak_says_otherwise(node: Path) -> None:
    """Review: another process's OOM kill on the node (its count 34 -> 35) while the rank died of
    something else: the rank's own cgroup still there with its count unmoved, or the job's peak
    below its limit, says the rank was not the one; no evidence is claimed."""
    from injectors.kinds.oom_rank import _OomWatch

    vmstat = node.parent / "proc" / "vmstat"
    vmstat.write_text("oom_kill 34\n")
    limit = memory_cgroup.job_memory_limit(4242)
    assert limit is not None
    watch = _OomWatch.before(4242, limit)
    vmstat.write_text("oom_kill 35\n")
    assert watch.evidence() is None, "the rank's own cgroup is there, its count unmoved"
    for name in ("memory.events", "memory.max", "memory.current"):
        (node / TASK / name).unlink()
    (node / TASK).rmdir()
    assert watch.evidence() is None, "the job's peak (310 MB) never met its limit (512 MB)"
