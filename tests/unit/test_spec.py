"""The spec: what it accepts, and that bad input names the field and what is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.failure_classes import FailureClass
from orchestrator.campaign.policy import CHAINED_JOBS_BUDGET, policy_entry
from orchestrator.campaign.runs import expand_runs
from orchestrator.campaign.spec import SpecError, load_campaign, parse_campaign, time_limit_minutes

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, **overrides: object) -> dict:
    spec = {
        "name": "t",
        "backend": "local",
        "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 20000, "steps": 40, "seed": 1},
        "checkpoint": {"every_steps": 10, "keep": 2},
        "resources": {"nodes": 1, "tasks_per_node": 2},
        "faults": [{"kind": "kill-rank", "after": {"fixed": 1.5}, "rank": 1}],
    }
    spec.update(overrides)
    return spec


def test_valid_spec_gets_defaults_and_absolute_workdir(tmp_path: Path) -> None:
    raw = _spec(tmp_path, workdir="work")
    campaign = parse_campaign(raw, base_dir=tmp_path)
    assert campaign.workdir == tmp_path / "work"
    assert campaign.restart.max_restarts == 3
    assert campaign.faults[0].signal == "SIGKILL"
    assert campaign.faults[0].after.fixed == 1.5


def test_unknown_top_level_key_names_it_and_lists_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        parse_campaign(_spec(tmp_path, wrkdir="x"), base_dir=tmp_path)
    message = str(error.value)
    assert "wrkdir: unknown key" in message
    assert "workdir" in message and "checkpoint" in message


def test_unknown_nested_key_lists_that_sections_keys(tmp_path: Path) -> None:
    raw = _spec(tmp_path, checkpoint={"every": 5})
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "checkpoint.every: unknown key; valid keys here: every_steps, keep" in str(error.value)


def test_unknown_key_inside_a_fault_names_the_list_item(tmp_path: Path) -> None:
    raw = _spec(tmp_path, faults=[{"kind": "kill-rank", "sig": "KILL"}])
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "faults.0.sig: unknown key" in str(error.value)
    assert "signal" in str(error.value)


def test_wrong_type_names_the_field(tmp_path: Path) -> None:
    raw = _spec(tmp_path, workload={"framework": "torch", "steps": "many"})
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "workload.steps" in str(error.value)


def test_unknown_framework_lists_the_valid_ones(tmp_path: Path) -> None:
    raw = _spec(tmp_path, workload={"framework": "jax"})
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "workload.framework" in str(error.value) and "torch" in str(error.value)


def test_missing_workdir_parent_is_refused(tmp_path: Path) -> None:
    raw = _spec(tmp_path, workdir=str(tmp_path / "no" / "such" / "work"))
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "workdir: parent directory" in str(error.value)


def test_local_backend_refuses_several_nodes(tmp_path: Path) -> None:
    raw = _spec(tmp_path, resources={"nodes": 2, "tasks_per_node": 1})
    with pytest.raises(SpecError, match="resources.nodes"):
        parse_campaign(raw, base_dir=tmp_path)


def test_bad_signal_and_bad_time(tmp_path: Path) -> None:
    raw = _spec(tmp_path, faults=[{"signal": "SIGBOGUS"}], resources={"time": "soon"})
    with pytest.raises(SpecError) as error:
        parse_campaign(raw, base_dir=tmp_path)
    assert "faults.0.signal" in str(error.value) and "SIGKILL" in str(error.value)
    assert "resources.time" in str(error.value)


def test_load_campaign_reports_yaml_errors_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such spec file"):
        load_campaign(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_campaign(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(SpecError, match="a spec is a mapping"):
        load_campaign(scalar)


def test_sweep_expands_grid_with_baseline_twins(tmp_path: Path) -> None:
    raw = _spec(tmp_path, baseline=True,
                sweep={"grid": {"workload.params": [20000, 40000], "checkpoint.every_steps": [5, 10]}})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert len(runs) == 8
    faulted = [run for run in runs if not run.is_baseline]
    assert {(r.campaign.workload.params, r.campaign.checkpoint.every_steps) for r in faulted} == {
        (20000, 5), (20000, 10), (40000, 5), (40000, 10)}
    twins = [run for run in runs if run.is_baseline]
    assert all(twin.campaign.faults == [] for twin in twins)
    assert {twin.baseline_of for twin in twins} == {run.run_id for run in faulted}
    assert len({run.run_id for run in runs}) == 8


def test_runs_that_differ_only_in_their_faults_share_one_twin(tmp_path: Path) -> None:
    kill = [{"kind": "kill-rank", "after": {"at_step": 5}, "rank": 0}]
    hang = [{"kind": "hang-rank", "after": {"at_step": 5}, "rank": 0}]
    raw = _spec(tmp_path, baseline=True, sweep={"grid": [{"faults": [kill, hang]},
                                                         {"faults": [kill], "workload.steps": [30]}]})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert [run.run_id for run in runs] == ["r000", "r000-baseline", "r001", "r002", "r002-baseline"]
    by_id = {run.run_id: run for run in runs}
    assert by_id["r000"].twin == by_id["r001"].twin == "r000-baseline"  # kill and hang: the same training
    assert by_id["r002"].twin == "r002-baseline" and by_id["r002-baseline"].campaign.workload.steps == 30
    assert by_id["r000-baseline"].baseline_of == "r000" and by_id["r000-baseline"].campaign.faults == []


def test_runs_that_differ_in_how_they_recover_share_one_twin(tmp_path: Path) -> None:
    """A fault-free run trains the same whatever its restart strategy or spare nodes; a run on other
    resources (here: its nodes held alone, which at a site may also bring the node's memory) gets a
    twin of its own, with the same directives."""
    kill = [{"kind": "kill-rank", "after": {"at_step": 5}, "rank": 0}]
    raw = _spec(tmp_path, backend="slurm", baseline=True, sweep={"grid": [
        {"restart.strategy": ["resubmit", "in-allocation"], "faults": [kill]},
        {"restart.strategy": ["in-allocation"], "resources.spare_nodes": [1], "faults": [kill]},
        {"resources.extra_directives": [["--exclusive"]], "faults": [kill]}]})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    twins = {run.run_id: run.twin for run in runs if not run.is_baseline}
    assert len(set(twins.values())) == 2, twins
    exclusive = next(run for run in runs if run.campaign.resources.extra_directives and not run.is_baseline)
    assert [twin for run_id, twin in twins.items() if twin == exclusive.twin] == [exclusive.twin]
    by_id = {run.run_id: run for run in runs}
    assert by_id[exclusive.twin].campaign.resources.extra_directives == ["--exclusive"]


def test_runs_that_keep_their_checkpoints_on_other_filesystems_share_one_twin(tmp_path: Path) -> None:
    """Where a run's checkpoints live changes nothing it trains (the scratch profile: one run's on a
    small filesystem it fills): one twin, keeping its checkpoints where the first run keeps its own."""
    kill = [{"kind": "kill-rank", "after": {"at_step": 5}, "rank": 0}]
    raw = _spec(tmp_path, baseline=True, checkpoint={"every_steps": 5, "directory": "/scratch/{run_id}"},
                sweep={"grid": [{"faults": [kill]},
                                {"faults": [kill], "checkpoint.directory": ["/small/{run_id}"]}]})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert [run.run_id for run in runs] == ["r000", "r000-baseline", "r001"]
    assert runs[1].campaign.checkpoint.directory == "/scratch/{run_id}"
    assert runs[2].twin == "r000-baseline" and runs[2].campaign.checkpoint.directory == "/small/{run_id}"


def test_a_walltime_runs_twin_lives_as_long_as_the_longest_run_it_serves(tmp_path: Path) -> None:
    """A time limit changes nothing a run trains: runs that differ in it share one twin, which gets
    the longest limit, so a run whose short limit is its fault does not end its twin the same way."""
    kill = [{"kind": "kill-rank", "after": {"at_step": 5}, "rank": 0}]
    timeout = [{"kind": "timeout", "after": {"at_step": 5}}]
    raw = _spec(tmp_path, backend="slurm", baseline=True,
                resources={"nodes": 1, "tasks_per_node": 2, "time": "00:20:00", "warning_s": 30},
                sweep={"grid": [{"faults": [timeout], "resources.time": ["00:01:00"]}, {"faults": [kill]}]})
    runs = expand_runs(parse_campaign(raw, base_dir=tmp_path))
    assert [run.run_id for run in runs] == ["r000", "r000-baseline", "r001"]
    by_id = {run.run_id: run for run in runs}
    assert by_id["r000"].twin == by_id["r001"].twin == "r000-baseline"
    assert by_id["r000"].campaign.resources.time == "00:01:00"
    assert by_id["r000-baseline"].campaign.resources.time == "00:20:00"


def test_sweep_with_unknown_key_or_invalid_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no key 'paramz'.*valid:.*params"):
        expand_runs(parse_campaign(_spec(tmp_path, sweep={"grid": {"workload.paramz": [1]}}), base_dir=tmp_path))
    with pytest.raises(SpecError, match="workload.steps"):
        expand_runs(parse_campaign(_spec(tmp_path, sweep={"grid": {"workload.steps": [0]}}), base_dir=tmp_path))


@pytest.mark.parametrize("text,minutes", [("30", 30), ("10:30", 10.5), ("01:30:00", 90), ("1-02", 1560),
                                          ("2-00:10:00", 2890)])
def test_time_limit_minutes(text: str, minutes: float) -> None:
    assert time_limit_minutes(text) == pytest.approx(minutes)


@pytest.mark.parametrize("name", ["quick.yaml", "slurm-quick.yaml", "paper-study.yaml", "paper-study-quick.yaml",
                                  "fault-catalogue.yaml", "fault-catalogue-local.yaml", "strategies.yaml",
                                  "failure-classes.yaml"])
def test_shipped_campaigns_are_valid(name: str) -> None:
    campaign = load_campaign(REPO / "experiments" / "campaigns" / name)
    runs = expand_runs(campaign)
    assert any(run.is_baseline for run in runs)
    assert any(run.campaign.faults for run in runs)
    assert yaml.safe_load((REPO / "experiments" / "campaigns" / name).read_text())["name"] == campaign.name


def test_a_strategy_the_backend_cannot_run_names_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"restart.strategy 'requeue' does not run on the local backend: the local "
                                        r"backend has no scheduler queue to put a job back in; "
                                        r"valid there: resubmit, in-allocation, warm, elastic"):
        parse_campaign(_spec(tmp_path, restart={"strategy": "requeue"}), base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"restart.strategy 'requeue' does not run on the pbs backend: the pbs "
                                        r"backend cannot requeue a job \(the PBS wrappers' qrerun does not work\); "
                                        r"valid there: resubmit, in-allocation, warm, elastic"):
        parse_campaign(_spec(tmp_path, backend="pbs", restart={"strategy": "requeue"}), base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"strategy.*Input should be 'resubmit', 'in-allocation', 'requeue', 'warm' or 'elastic'"):
        parse_campaign(_spec(tmp_path, restart={"strategy": "hot"}), base_dir=tmp_path)


def test_warm_needs_a_built_in_workload_it_can_re_form(tmp_path: Path) -> None:
    warm = {"strategy": "warm", "warm_spares": 1}
    assert parse_campaign(_spec(tmp_path, restart=warm), base_dir=tmp_path).restart.warm_spares == 1
    chainer = {"framework": "chainer", "params": 2000, "steps": 40}
    # Chainer restarts every rank in a warm spare set: warm_spares counts sets, and 0 leaves none.
    assert parse_campaign(_spec(tmp_path, restart=warm, workload=chainer), base_dir=tmp_path).restart.warm_spares == 1
    with pytest.raises(SpecError, match=r"restart.warm_spares is 0: chainer restarts every rank in a warm spare set"):
        parse_campaign(_spec(tmp_path, restart={**warm, "warm_spares": 0}, workload=chainer), base_dir=tmp_path)
    script = {"command": ["python", "train.py"], "framework": "torch", "steps": 40}
    with pytest.raises(SpecError, match=r"a command workload brings its own"):
        parse_campaign(_spec(tmp_path, restart=warm, workload=script), base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"warm_spares"):
        parse_campaign(_spec(tmp_path, restart={**warm, "warm_spares": -1}), base_dir=tmp_path)


def test_spare_nodes_are_for_in_allocation_and_warm_only(tmp_path: Path) -> None:
    spec = _spec(tmp_path, backend="slurm", resources={"nodes": 2, "tasks_per_node": 1, "spare_nodes": 1})
    with pytest.raises(SpecError, match=r"resources.spare_nodes \(1\) is for restart.strategy in-allocation or warm"):
        parse_campaign(spec, base_dir=tmp_path)
    spec["restart"] = {"strategy": "in-allocation"}
    assert parse_campaign(spec, base_dir=tmp_path).resources.spare_nodes == 1
    spec["restart"] = {"strategy": "warm"}  # spare sets placed on the spare node outlive a node crash
    assert parse_campaign(spec, base_dir=tmp_path).resources.spare_nodes == 1
    with pytest.raises(SpecError, match=r"resources.spare_nodes: the pbs backend launches with "
                                        r"mpiexec, which cannot move a dead node's ranks to a spare; set it to 0 \(spare nodes work "
                                        r"on the slurm backend\)"):
        parse_campaign({**spec, "backend": "pbs"}, base_dir=tmp_path)


def test_the_walltime_warning_must_come_before_the_walltime(tmp_path: Path) -> None:
    spec = _spec(tmp_path, resources={"nodes": 1, "tasks_per_node": 2, "time": "00:01:00", "warning_s": 60})
    with pytest.raises(SpecError, match=r"resources.warning_s \(60 s\) must be shorter than resources.time "
                                        r"\(00:01:00, 60 s\)"):
        parse_campaign(spec, base_dir=tmp_path)
    spec["resources"]["warning_s"] = 20
    assert parse_campaign(spec, base_dir=tmp_path).resources.warning_s == 20
    assert parse_campaign(_spec(tmp_path), base_dir=tmp_path).resources.warning_s == 90


def test_a_preemption_that_requeues_needs_a_scheduler_that_requeues(tmp_path: Path) -> None:
    preempt = {"kind": "preempt", "after": {"at_step": 20}, "then": "requeue"}
    with pytest.raises(SpecError, match=r"fault 0: preempt then: requeue needs a scheduler that requeues a running "
                                        r"job \(slurm: scontrol requeue\); the pbs backend cannot here: use then: cancel"):
        parse_campaign(_spec(tmp_path, backend="pbs", faults=[preempt]), base_dir=tmp_path)
    for backend, then in (("slurm", "requeue"), ("pbs", "cancel")):
        campaign = parse_campaign(_spec(tmp_path, backend=backend, faults=[{**preempt, "then": then}]), base_dir=tmp_path)
        assert campaign.faults[0].kind == "preempt"
    timeout = {"kind": "timeout", "after": {"at_step": 20}}
    assert parse_campaign(_spec(tmp_path, backend="pbs", faults=[timeout]), base_dir=tmp_path).faults[0].kind == "timeout"


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "experiments" / "campaigns").glob("*.yaml")),
                         ids=lambda path: path.stem)
def test_every_shipped_campaign_is_a_valid_spec_whose_runs_expand(path: Path) -> None:
    """The campaigns the README points users at validate as they are (paths resolved from their folder)."""
    campaign = load_campaign(path)
    assert campaign.name == path.stem and expand_runs(campaign)


def test_a_swept_runs_policy_keeps_the_class_defaults_the_spec_left_unset(tmp_path: Path) -> None:
    """A policy entry sets only what it names; the class's defaults fill the rest. A sweep point
    re-validates the spec from its dump, and every field of the entry came back as set: a swept
    run's TIMEOUT restarted within max_restarts instead of its own budget of chained jobs."""
    timeout_backoff = {"policy": {"TIMEOUT": {"backoff_s": 10}}}
    raw = _spec(tmp_path, restart=timeout_backoff, sweep={"grid": {"workload.seed": [1, 2]}})
    campaign = parse_campaign(raw, base_dir=tmp_path)
    for config in [campaign, *(run.campaign for run in expand_runs(campaign))]:
        entry = policy_entry(config.restart.policy, FailureClass.TIMEOUT)
        assert (entry.backoff_s, entry.budget, entry.spends_budget) == (10, CHAINED_JOBS_BUDGET, False), config.name
    stored = parse_campaign(campaign.model_dump(mode="json"), base_dir=tmp_path)  # as the ledger keeps it
    assert policy_entry(stored.restart.policy, FailureClass.TIMEOUT).spends_budget is False


def test_disk_full_is_refused_at_plan_on_a_filesystem_bigger_than_it_may_fill(tmp_path: Path) -> None:
    """Issue 22, item 4: said up front with what to do, for the run whose checkpoints it would fill
    (checkpoint.directory, made when the drill starts: its nearest existing parent's filesystem)."""
    from orchestrator.faults.job_control import disk_full_refusals

    full = [{"kind": "disk-full", "after": {"at_step": 5}, "max_fill_mb": 0.001}]
    raw = _spec(tmp_path, faults=full, checkpoint={"every_steps": 5, "directory": str(tmp_path / "scratch/{run_id}")})
    [problem] = disk_full_refusals(expand_runs(parse_campaign(raw, base_dir=tmp_path)))
    assert problem.startswith(f"r000: faults[0] (disk-full): {tmp_path} is on a filesystem with"), problem
    assert "more than max_fill_mb (0.001)" in problem and "checkpoint.directory" in problem
    small = _spec(tmp_path, faults=[{**full[0], "max_fill_mb": 65536}],  # /dev/shm: half the memory
                  checkpoint={"every_steps": 5, "directory": "/dev/shm/faultdrill-never-made/{run_id}"})
    assert disk_full_refusals(expand_runs(parse_campaign(small, base_dir=tmp_path))) == []


def test_a_drill_that_is_not_root_is_refused_at_plan_the_kinds_that_need_root(tmp_path: Path, monkeypatch) -> None:
    """Issue 22, the user profile: the jobs run as the drill's user, so oom-rank (a memory cgroup
    of its own) and a node fault through scripts/cluster cannot act; said up front, each with
    what to do, naming the user. A node fault with the site's own commands, and the other kinds,
    are not refused; off the project's cluster the node fault's refusal is node_fault_refusals'."""
    from orchestrator.faults import job_control
    from orchestrator.faults.job_control import privilege_refusals

    faults = [{"kind": "oom-rank", "after": {"at_step": 5}}, {"kind": "node-crash", "after": {"at_step": 6}},
              {"kind": "node-crash", "after": {"at_step": 7}, "command": {"act": ["site-crash", "{node}"], "mend": ["site-mend", "{node}"]}},
              {"kind": "kill-rank", "after": {"at_step": 8}}]
    runs = expand_runs(parse_campaign(_spec(tmp_path, backend="slurm", faults=faults,
                                            resources={"nodes": 2, "time": "00:10:00"}), base_dir=tmp_path))
    monkeypatch.setattr(job_control, "on_own_cluster", lambda: True)
    oom, crash = privilege_refusals(runs, uid=0o7654321)
    assert oom.startswith("faults[0] (oom-rank): it caps the rank's memory") and "you are 2054353 (uid 2054353)" in oom
    assert crash.startswith("faults[1] (node-crash): scripts/cluster acts on the node as root") and "command:" in crash
    assert privilege_refusals(runs, uid=0) == []
    monkeypatch.setattr(job_control, "on_own_cluster", lambda: False)
    assert privilege_refusals(runs, uid=0o7654321) == [oom]
    assert "does not confine a job's memory" in oom, "the way an ordinary user could: the scheduler's limit"


def test_where_the_scheduler_confines_memory_oom_rank_needs_no_root_and_limit_job_needs_that_site(
        tmp_path: Path) -> None:
    """Issue 22 item 4: under Slurm's task/cgroup (ConstrainRAMSpace) the rank outgrows its job's
    --mem and Slurm's OOM kills it, so an ordinary user may drill oom-rank (``limit: auto`` or
    ``job``); ``limit: agent`` (a cgroup of the agent's own) stays root's. ``limit: job`` where the
    scheduler confines nothing is refused at plan, root or not."""
    from orchestrator.faults.job_control import memory_limit_refusals, privilege_refusals

    def runs_with(limit: str) -> list:
        faults = [{"kind": "oom-rank", "after": {"at_step": 5}, "limit": limit}]
        return expand_runs(parse_campaign(_spec(tmp_path, backend="slurm", faults=faults,
                                                resources={"nodes": 1, "time": "00:10:00"}), base_dir=tmp_path))

    def confined(run: object) -> bool:
        return True

    def unconfined(run: object) -> bool:
        return False

    user = 0o7654321
    assert privilege_refusals(runs_with("auto"), uid=user, confines_memory=confined) == []
    assert privilege_refusals(runs_with("job"), uid=user, confines_memory=unconfined) == []
    [agent] = privilege_refusals(runs_with("agent"), uid=user, confines_memory=confined)
    assert agent.startswith("faults[0] (oom-rank): it caps the rank's memory") and "confine" not in agent
    assert memory_limit_refusals(runs_with("job"), confined) == []
    assert memory_limit_refusals(runs_with("auto"), unconfined) == []
    [refused] = memory_limit_refusals(runs_with("job"), unconfined)
    assert "limit: job" in refused and "task/cgroup" in refused and "limit: agent" in refused, refused


def test_a_newcomers_mistakes_are_said_in_the_specs_own_words(tmp_path: Path) -> None:
    """Issue 23, item 5: `after: 3` gave four lines naming pydantic's classes; a YAML error named
    "<unicode string>", not the file."""
    from orchestrator.campaign.spec import load_campaign

    number = tmp_path / "after.yaml"
    number.write_text(f"name: t\nworkdir: {tmp_path / 'w'}\nfaults:\n  - kind: kill-rank\n    after: 3\n")
    with pytest.raises(SpecError) as said:
        load_campaign(number)
    lines = str(said.value).splitlines()[1:]
    assert lines == ["  faults.0.after: a number (3) is not valid here; use {fixed: SECONDS}, {exponential: "
                     "MEAN_SECONDS}, {weibull: SCALE_SECONDS, shape: K} or {at_step: STEP} (e.g. after: {fixed: 3})"], lines
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: t\nworkdir: [unclosed\n")
    with pytest.raises(SpecError, match=r'in "[^"]*broken.yaml", line 2') as said:
        load_campaign(broken)
    assert "<unicode string>" not in str(said.value)


def test_a_command_given_the_spec_instead_of_its_workdir_takes_the_specs_workdir(tmp_path: Path) -> None:
    """Issue 23, item 5: `faultdrill report quick.yaml` said "no ledger.sqlite here"."""
    from orchestrator.cli import workdir_of

    spec = tmp_path / "quick.yaml"
    spec.write_text(f"name: t\nworkdir: {tmp_path / 'w'}\n")
    assert workdir_of(spec) == (tmp_path / "w").resolve()
    assert workdir_of(tmp_path / "w") == tmp_path / "w"


def test_a_signal_directive_is_refused_naming_warning_s(tmp_path: Path) -> None:
    """Issue 23, item 4: `--signal=USR1@300` was accepted while Faultdrill sets its own --signal."""
    spec = {"name": "t", "backend": "slurm", "workdir": str(tmp_path / "w"),
            "resources": {"extra_directives": ["--signal=USR1@300"]}}
    with pytest.raises(SpecError, match=r"--signal is set by Faultdrill on slurm.*resources.warning_s"):
        parse_campaign(spec, base_dir=tmp_path)


def test_a_setup_line_continued_with_a_backslash_is_refused(tmp_path: Path) -> None:
    """Review 35: `module load cuda \\` joined the next line of the batch script and broke it."""
    spec = {"name": "t", "backend": "slurm", "workdir": str(tmp_path / "w"),
            "workload": {"setup": ["module load cuda/12.2 \\"]}}
    with pytest.raises(SpecError, match="no trailing backslash"):
        parse_campaign(spec, base_dir=tmp_path)


def test_a_rank_job_from_a_newer_faultdrill_loads_in_an_older_rank_api() -> None:
    """Review 35: an installed rank-API wheel older than the orchestrator died at init on a field it
    did not know; it leaves such fields out."""
    from experiments.layout import RankJob, WorkloadSpec, rank_job_from_dict, rank_job_to_dict

    data = rank_job_to_dict(RankJob(run_id="r", run_dir="/tmp/r", attempt=0, workload=WorkloadSpec(framework="torch"),
                                    checkpoint_every=5, checkpoint_keep=2))
    data["a_later_field"] = 1
    data["workload"]["another"] = "x"
    assert rank_job_from_dict(data).run_id == "r"
