"""The warm coordinator's host in a batch job (experiments/warm/batch_host.py): where a
spare set goes (spare nodes taken in turn, lost nodes never), and what each launcher runs for a
member and for a set (the drills on Slurm and PBS run them for real: tests/cluster/test_warm_*)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from experiments.launchers import Launch, Mpiexec, MpiRuntime, argv, runtime_of
from experiments.warm.batch_host import MpiexecMembers, SrunMembers, set_nodes
from experiments.warm.coordinator import SpareNotStarted

COMMAND = ["python", "-u", "-m", "submitit.core._submit", "/runs/r000/submitit"]


def test_spare_sets_take_the_spare_nodes_in_turn_and_never_a_lost_one() -> None:
    nodes = ["n1", "n2", "n3"]  # 2 nodes of ranks and 1 spare node
    assert [set_nodes(nodes, 2, number) for number in range(4)] == [["n1", "n2"], ["n1", "n3"]] * 2
    assert set_nodes(nodes, 2, 2, frozenset({"n2"})) == ["n1", "n3"], "n2 crashed: no set goes there"
    assert [set_nodes(["n1", "n2"], 2, number) for number in range(3)] == [["n1", "n2"]] * 3
    with pytest.raises(SpareNotStarted, match=r"needs 2 node\(s\); the job has 1 left \(lost: n2\)"):
        set_nodes(["n1", "n2"], 2, 1, frozenset({"n2"}))


def test_srun_runs_each_member_as_a_step_of_its_own_and_a_set_as_one_step() -> None:
    member = SrunMembers().member(3, "n2", "%j_3_log.out", "%j_3_log.err", COMMAND, {}).argv
    assert member[0] == "srun" and member[-len(COMMAND):] == COMMAND
    assert {"--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--kill-on-bad-exit=0"} <= set(member)
    spare_set = SrunMembers(mpi="pmix").spare_set(1, ["n1", "n3"], 1, "%j_%t_log.out", "%j_%t_log.err", COMMAND, {}).argv
    assert "--nodelist=n1,n3" in spare_set and "--mpi=pmix" in spare_set and "--kill-on-bad-exit=0" in spare_set
    assert "--output=%j_set1-%t_log.out" in spare_set and spare_set[-len(COMMAND):] == COMMAND


@pytest.fixture(autouse=True)
def _site_open_mpi(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The node's mpiexec as it says its release (a unit test starts no process)."""
    import experiments.warm.batch_host as batch_host
    from experiments.launchers import runtime_of

    said = getattr(request, "param", "mpiexec (OpenRTE) 4.1.4")
    monkeypatch.setattr(batch_host, "site_runtime", lambda: runtime_of(said))


@pytest.mark.parametrize(("_site_open_mpi", "option"), [("mpiexec (OpenRTE) 4.1.4", "orte_tmpdir_base"),
                                                        ("mpiexec (Open MPI) 5.0.11", "prte_tmpdir_base")],
                         indirect=["_site_open_mpi"])
def test_mpiexec_exports_what_is_set_and_gives_each_launch_its_own_session_dir(tmp_path: Path, option: str) -> None:
    launcher = MpiexecMembers(forwarded=("FAULTDRILL_RUN_DIR", "FAULTDRILL_UNSET"), session_dir=str(tmp_path))
    env = {"FAULTDRILL_RUN_DIR": "/runs/r000", "FAULTDRILL_WARM_SLOT": "2", "FAULTDRILL_WARM_COORDINATOR": "n1:4000"}
    member = launcher.member(2, "n2", "7_2_log.out", "7_2_log.err", COMMAND, env)
    exported = [member.argv[i + 1] for i, item in enumerate(member.argv) if item == "-x"]
    assert exported == ["FAULTDRILL_RUN_DIR", "FAULTDRILL_WARM_COORDINATOR", "FAULTDRILL_WARM_SLOT"], exported
    assert member.argv[member.argv.index("-n"):][:2] == ["-n", "1"]
    assert member.argv[member.argv.index("--host"):][:2] == ["--host", "n2"] and member.argv[-len(COMMAND):] == COMMAND
    assert (member.stdout, member.stderr) == ("7_2_log.out", "7_2_log.err")
    spare_set = launcher.spare_set(1, ["n1", "n2"], 2, "7_%t_log.out", "7_%t_log.err", COMMAND, env)
    assert "ppr:2:node" in spare_set.argv and "n1:2,n2:2" in spare_set.argv and spare_set.stdout == "7_set1_log.out"
    session_dirs = {argv[argv.index(option) + 1] for argv in (member.argv, spare_set.argv)}
    assert len(session_dirs) == 2 and all(Path(d).is_dir() for d in session_dirs), "launches race on a shared one"


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory another user's needs root")
def test_a_session_directory_another_user_made_first_is_never_used(tmp_path: Path) -> None:
    """Issue 28's review, item 4: a launch's Open MPI session directory under a shared base (the
    fallback was /tmp/slot-N) was used even when a stranger had made it first. Its re-review: a name
    known before the launch (set-N) could be made first on another node. Each launch's is a new one
    of a random name."""
    from experiments.warm.batch_host import MpiexecMembers

    planted = tmp_path / "set-0"
    planted.mkdir(mode=0o777)
    os.chown(planted, 54321, -1)
    members = MpiexecMembers(forwarded=(), session_dir=str(tmp_path))
    made = [Path(members._mpiexec("set-0", {}).session_dir) for _ in range(2)]
    assert planted not in made and made[0] != made[1]
    assert all(path.parent == tmp_path and path.name.startswith("set-0-") for path in made)
    assert all(path.lstat().st_uid == os.geteuid() and stat.S_IMODE(path.lstat().st_mode) == 0o700 for path in made)


@pytest.mark.parametrize("prrte,words", [(True, ["--runtime-options", "recoverable"]),
                                         (False, ["--mca", "orte_abort_on_non_zero_status", "0"])])
def test_a_warm_sets_mpiexec_lets_the_survivors_of_a_dead_task_live_and_a_rank_launch_does_not(
        prrte: bool, words: list[str]) -> None:
    """A set's survivors serve their state to the next set: Open MPI must not abort them when one
    task dies (measured: by default they are ended ~1 s after the death). An ordinary launch keeps
    Open MPI's abort (a dead rank ends the job at once)."""
    runtime = MpiRuntime(program="mpiexec", prrte=prrte)
    warm_set = argv(Mpiexec(runtime=runtime, survivors_stay=True).words(Launch(COMMAND, tasks=2)))
    ranks = argv(Mpiexec(runtime=runtime).words(Launch(COMMAND, tasks=2)))
    assert _contains(warm_set, words) and not _contains(ranks, words)


def _contains(argv_words: list[str], words: list[str]) -> bool:
    return any(argv_words[index:index + len(words)] == words for index in range(len(argv_words)))


def test_the_local_backends_warm_set_asks_the_sites_mpiexec_which_flag_keeps_the_survivors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: with workload.mpi site (its release unknown until asked) the local launch of a warm
    set got no flag at all: Open MPI ended the survivors ~1 s after the death."""
    from orchestrator.backends.local import backend

    monkeypatch.setattr(backend, "runtime_here", lambda program: runtime_of("mpiexec (OpenRTE) 4.1.4", program))
    warm_set = backend.mpi_launcher(2, MpiRuntime(prrte=None), survivors_stay=True)
    assert _contains(warm_set, ["--mca", "orte_abort_on_non_zero_status", "0"])
    assert not _contains(backend.mpi_launcher(2, MpiRuntime(prrte=None)), ["orte_abort_on_non_zero_status"])
