"""Scheduler output parsing on recorded outputs, and the one state table."""

from __future__ import annotations

import time

import pytest

from orchestrator.backends.slurm import site
from orchestrator.backends.slurm.backend import attempt_jobs, parse_sacct, parse_sbatch_parsable, parse_squeue
from orchestrator.backends.slurm.site import DEFAULT_MAX_ARRAY_SIZE, confines_memory, parse_max_array_size
from orchestrator.commands import CommandError, CommandResult, run_command
from orchestrator.states import JobState, from_slurm

# Recorded from the local cluster (slurm-wlm 22.05.8).
SQUEUE = "41|RUNNING\n42|PENDING\n43|COMPLETING\n44|FAILED\n45|COMPLETED\n"
SACCT = "40|CANCELLED by 0\n39|NODE_FAIL\n38|OUT_OF_MEMORY\n37|TIMEOUT\n36|COMPLETED\n"


def test_squeue_lines_map_to_states() -> None:
    assert parse_squeue(SQUEUE) == {
        "41": JobState.RUNNING, "42": JobState.PENDING, "43": JobState.COMPLETING,
        "44": JobState.FAILED, "45": JobState.COMPLETED,
    }


def test_sacct_lines_map_to_states_including_cancelled_by() -> None:
    states = parse_sacct(SACCT)
    assert states["40"] is JobState.CANCELLED
    assert states["39"] is JobState.NODE_FAIL
    assert states["38"] is JobState.OUT_OF_MEMORY
    assert states["37"] is JobState.TIMEOUT
    assert states["36"] is JobState.COMPLETED


def test_unknown_words_are_unknown_and_never_success() -> None:
    assert from_slurm("WEIRD_NEW_STATE") is JobState.UNKNOWN
    assert not JobState.UNKNOWN.is_success
    assert not JobState.UNKNOWN.is_terminal
    assert JobState.COMPLETED.is_success and JobState.COMPLETED.is_terminal
    assert JobState.FAILED.is_terminal and not JobState.FAILED.is_success


@pytest.mark.parametrize("stdout,job_id", [("1234\n", "1234"), ("77;cluster\n", "77;cluster")])
def test_sbatch_parsable(stdout: str, job_id: str) -> None:
    assert parse_sbatch_parsable(stdout) == job_id


def test_sbatch_without_id_is_an_error_carrying_output() -> None:
    with pytest.raises(CommandError, match="no job id") as error:
        parse_sbatch_parsable("sbatch: error: something\n")
    assert "something" in error.value.stdout


def test_command_wrapper_refuses_shell_strings() -> None:
    with pytest.raises(TypeError):
        run_command("echo hi")  # type: ignore[arg-type]  # a string: what the wrapper must refuse


@pytest.mark.drill
def test_command_wrapper_error_carries_command_code_and_streams() -> None:
    with pytest.raises(CommandError) as error:
        run_command(["bash", "-c", "echo out; echo err >&2; exit 7"])
    assert error.value.returncode == 7
    assert error.value.stdout.strip() == "out" and error.value.stderr.strip() == "err"
    assert error.value.command[0] == "bash"


@pytest.mark.drill
def test_command_wrapper_times_out_and_retries(tmp_path) -> None:
    counter = tmp_path / "count"
    script = f'echo x >> "{counter}"; sleep 5'
    with pytest.raises(CommandError, match="timed out"):
        run_command(["bash", "-c", script], timeout_s=0.3, retries=1, retry_delay_s=0.01)
    assert counter.read_text().count("x") == 2


@pytest.mark.drill
def test_command_not_found_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="command not found"):
        run_command(["/nonexistent/sbatch"])


def test_max_array_size_is_read_from_scontrol_show_config_or_slurms_default() -> None:
    config = "MaxArraySize            = 40001\nMaxJobCount             = 10000\n"
    assert parse_max_array_size(config) == 40001
    assert parse_max_array_size("MaxJobCount = 10000\n") == DEFAULT_MAX_ARRAY_SIZE == 1001
    assert parse_max_array_size("") == DEFAULT_MAX_ARRAY_SIZE


# sacctmgr -n -P's answers on the local cluster under the limits profile (scripts/cluster limits on).
ASSOC = ("show", "assoc", "format=MaxSubmit,DefaultQOS,QOS")
QOS = ("show", "qos", "format=MaxSubmitPU")
SACCTMGR = {ASSOC: "8||normal\n", QOS: "\n"}


@pytest.mark.parametrize(("enforce", "answers", "qos", "limit"), [
    ("associations,limits", SACCTMGR, None, (8, "your association's MaxSubmitJobs")),
    ("associations,limits", {ASSOC: "8||normal\n", QOS: "5\n"}, None, (5, "QOS normal's MaxSubmitPU")),
    # several QOS, no default: which one the jobs run under is not known, unless the spec asks one
    ("associations,limits", {ASSOC: "||normal,debug\n", QOS: "2\n"}, None, None),
    ("associations,limits", {ASSOC: "||normal,debug\n", QOS: "2\n"}, "debug", (2, "QOS debug's MaxSubmitPU")),
    ("associations,limits", {ASSOC: "|debug|normal,debug\n", QOS: "2\n"}, None, (2, "QOS debug's MaxSubmitPU")),
    ("associations,limits", {ASSOC: "||normal\n", QOS: "\n"}, None, None),
    ("associations,qos", SACCTMGR, None, None),  # qos without limits enforces no count (slurm.conf(5))
    ("none", SACCTMGR, None, None),
    ("safe", SACCTMGR, None, (8, "your association's MaxSubmitJobs")),  # safe sets limits
    ("limits", {}, None, None),  # sacctmgr fails: asked once
])
def test_the_users_limit_of_submitted_jobs_is_the_smallest_one_enforced(monkeypatch, enforce, answers, qos,
                                                                        limit) -> None:
    """Issue 22, item 6: MaxSubmitJobs of the user's associations and MaxSubmitPU of the QOS the
    jobs run under, only where AccountingStorageEnforce enforces limits; sacctmgr asked once when
    it fails."""
    asked = []

    def sacctmgr(args, **_kwargs):
        key = (args[3], args[4], args[-1])
        asked.append(key)
        if key not in answers:
            return CommandResult(tuple(args), 1, "", "sacctmgr: error: Problem talking to the database", 0.1)
        return CommandResult(tuple(args), 0, answers[key], "", 0.1)

    monkeypatch.setattr(site, "run_command", sacctmgr)
    found = site.max_submit_jobs(f"AccountingStorageEnforce = {enforce}\n", "fd-user", qos)
    assert (found.jobs, found.source) == limit if limit else found is None, found
    assert len(asked) <= (1 if not answers else 2), asked


@pytest.mark.parametrize(("enforce", "max_job_count", "limit"), [
    ("none", "10000", (10000, "the site's MaxJobCount (every user's jobs together)")),
    ("associations,limits", "5", (5, "the site's MaxJobCount (every user's jobs together)")),
    ("associations,limits", "50000", (8, "your association's MaxSubmitJobs")),
    ("none", None, None),
])
def test_the_sites_max_job_count_binds_the_drills_jobs_whatever_accounting_enforces(
        monkeypatch, enforce, max_job_count, limit) -> None:
    """Issue 29: every element of an array counts toward MaxJobCount (Slurm's default 10,000); a
    10,000-run sweep's last array waited in sbatch, then its runs went out one by one."""
    monkeypatch.setattr(site, "run_command", lambda args, **_kwargs: CommandResult(tuple(args), 0, SACCTMGR[
        (args[3], args[4], args[-1])], "", 0.1))
    config = f"AccountingStorageEnforce = {enforce}\n" + (f"MaxJobCount             = {max_job_count}\n"
                                                          if max_job_count else "")
    found = site.max_submit_jobs(config, "fd-user")
    assert (found.jobs, found.source) == limit if limit else found is None, found


def test_the_jobs_of_an_attempt_from_squeue_and_sacct_with_a_pending_throttled_array() -> None:
    """Issue 21, item 3: squeue lists a throttled array's pending elements as one line
    (``123_[2-9%2]``); it ended the drill (ValueError) when sorted. An element's attempt maps each
    array of its name to its own element; a job that is no array element ignores ranges."""
    squeue = "123_[2-9%2]\n123_0\n123_1\n"
    sacct = "123_0\n123_1\n120\n"
    assert attempt_jobs(squeue, sacct, array_index=4) == ["120_4", "123_4"]
    assert attempt_jobs(squeue, sacct, array_index=None) == ["120", "123_0", "123_1"]
    assert attempt_jobs("", "", array_index=None) == []


def test_a_slurm_that_confines_memory_names_task_cgroup_and_constrains_ram_space() -> None:
    """``scontrol show config`` as Slurm 22.05 prints it under the cgroup profile (recorded), and
    the ways it does not confine a job's memory where oom-rank can read it (review of issue 22):
    another task plugin, ConstrainRAMSpace off, a cgroup plugin that is neither v1, v2 nor
    autodetect, memory not consumable, no request below the node's memory (no --mem, no DefMemPer*)."""
    recorded = ("DefMemPerCPU            = 1024\nProctrackType           = proctrack/cgroup\n"
                "SelectTypeParameters    = CR_CORE_MEMORY\nTaskPlugin              = task/affinity,task/cgroup\n"
                "TaskPluginParam         = (null type)\nCgroup Support Configuration:\nCgroupAutomount         = no\n"
                "CgroupPlugin            = cgroup/v1\nConstrainRAMSpace       = yes\n")
    assert confines_memory(recorded)
    assert not confines_memory(recorded.replace("task/affinity,task/cgroup", "task/affinity"))
    assert not confines_memory(recorded.replace("ConstrainRAMSpace       = yes", "ConstrainRAMSpace       = no"))
    assert confines_memory(recorded.replace("cgroup/v1", "cgroup/v2"))
    assert confines_memory(recorded.replace("cgroup/v1", "autodetect"))
    assert not confines_memory(recorded.replace("cgroup/v1", "disabled"))
    assert not confines_memory(recorded.replace("CR_CORE_MEMORY", "CR_CORE"))
    no_default = recorded.replace("DefMemPerCPU            = 1024", "DefMemPerNode           = UNLIMITED")
    assert not confines_memory(no_default)
    assert confines_memory(no_default, ["--mem=700M"]) and confines_memory(no_default, ["--mem-per-cpu 2G"])
    assert not confines_memory(no_default, ["--account=ml"])
    assert not confines_memory("")


def test_the_steps_slurm_says_ran_out_of_memory_are_read_from_accounting(monkeypatch) -> None:
    """``sacct -n -P -o JobID,JobName,State -j N`` as Slurm 22.05 printed it under the cgroup profile
    (recorded): the rank step OUT_OF_MEMORY, the job and its batch step FAILED. Not the batch or
    extern step, not an agent's step; with a step name (an in-allocation attempt's), only its step:
    another attempt's OOM in the same job is not this one's (review of issue 22)."""
    from orchestrator.backends.slurm import backend as slurm_backend
    answers = {"recorded": "1004|fd-d-r000-a0|FAILED\n1004.batch|batch|FAILED\n1004.0|python|OUT_OF_MEMORY\n"
                           "1004.1|faultdrill-agent|COMPLETED\n1004.2|faultdrill-agent|COMPLETED\n",
               "others": "9|fd|FAILED\n9.batch|batch|OUT_OF_MEMORY\n9.extern|extern|OUT_OF_MEMORY\n"
                         "9.3|faultdrill-agent|OUT_OF_MEMORY\n9.4|faultdrill-ranks-1|OUT_OF_MEMORY\n"
                         "9.5|faultdrill-ranks-2|FAILED\n"}
    asked = []
    answer = ["recorded"]

    def sacct(args, **_kwargs):
        asked.append(list(args))
        return CommandResult(tuple(args), 0, answers[answer[0]], "", 0.1)

    monkeypatch.setattr(slurm_backend, "run_command", sacct)
    backend = slurm_backend.SlurmBackend("d1")
    assert backend.out_of_memory_steps("1004;other") == ("1004.0",)
    assert asked[0][:3] == ["sacct", "-M", "other"] and asked[0][-2:] == ["-j", "1004"]
    answer[0] = "others"
    assert backend.out_of_memory_steps("9") == ("9.4",)
    assert backend.out_of_memory_steps("9", "faultdrill-ranks-2") == ()
    assert backend.out_of_memory_steps("9", "faultdrill-ranks-1") == ("9.4",)


def test_a_poll_of_a_sweeps_arrays_finds_every_element_and_asks_accounting_in_parts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a 10,000-run sweep's poll. squeue (recorded format, -r) lists the 5,000 elements it
    still holds; the 5,000 it forgot are asked of sacct in parts of SACCT_IDS_AT_ONCE (one -j of
    them all passes the kernel's limit on one argument), each part's answer taken."""
    from orchestrator.backends.slurm import backend as slurm

    held = [f"700_{index}" for index in range(5000)]
    forgotten = [f"701_{index}" for index in range(5000)]
    asked: list[list[str]] = []

    def scheduler(args: list[str], **_: object) -> CommandResult:
        if args[0] == "squeue":
            return CommandResult(tuple(args), 0, "".join(f"{job}|PENDING\n" for job in held) + "9|RUNNING\n", "", 0.1)
        ids = args[args.index("-j") + 1].split(",")
        asked.append(ids)
        return CommandResult(tuple(args), 0, "".join(f"{job}|COMPLETED\n" for job in ids), "", 0.1)

    monkeypatch.setattr(slurm, "run_command", scheduler)
    states = slurm.SlurmBackend("drill").poll(held + forgotten)
    assert states == {**dict.fromkeys(held, JobState.PENDING), **dict.fromkeys(forgotten, JobState.COMPLETED)}
    assert [len(part) for part in asked] == [slurm.SACCT_IDS_AT_ONCE] * 5
    assert [job for part in asked for job in part] == forgotten


def test_a_poll_whose_accounting_answers_one_part_and_not_another_falls_back_after_the_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of issue 29: sacct answers the first part of a poll's lookup and times out on the
    second. A part that answers must not end the outage the other shows: the poll raises within
    the grace, then goes on without accounting (the forgotten jobs' states unknown), and asks
    no further part once accounting is down. Nor does another sacct that answers meanwhile."""
    from orchestrator.backends.slurm import backend as slurm

    missing = [f"800_{index}" for index in range(3000)]
    asked: list[str] = []

    def scheduler(args: list[str], **_: object) -> CommandResult:
        if args[0] in ("squeue", "scontrol"):
            out = "" if args[0] == "squeue" else "AccountingStorageType = accounting_storage/slurmdbd\n"
            return CommandResult(tuple(args), 0, out, "", 0.01)
        ids = args[args.index("-j") + 1].split(",")
        asked.append(ids[0])
        if "800_1000" in ids:
            raise CommandError(list(args), None, "", "", "timed out after 20 s")
        return CommandResult(tuple(args), 0, "".join(f"{job}|COMPLETED\n" for job in ids), "", 0.01)

    monkeypatch.setattr(slurm, "run_command", scheduler)
    backend = slurm.SlurmBackend("drill")
    backend.set_patience(0.2)  # grace 0.1 s
    with pytest.raises(CommandError):
        backend.poll(missing)
    deadline = time.monotonic() + 5
    while True:
        backend.end_time("5")  # another sacct that answers (helper 55): the poll's outage goes on
        try:
            states = backend.poll(missing)
            break
        except CommandError:
            assert time.monotonic() < deadline, "the grace never ran out"
            time.sleep(0.02)
    assert states["800_0"] is JobState.COMPLETED and states["800_2999"] is JobState.UNKNOWN
    asked.clear()
    backend.poll(missing)
    assert asked == ["800_0", "800_1000"], "no part asked once accounting is down"
