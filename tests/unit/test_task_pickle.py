"""experiments/task.py's reading of submitit's pickled call: waited for as submitit waits (an array
element may start before its pickle is in place), named when it never comes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from submitit.core import utils as submitit_utils

from experiments import task
from experiments.layout import ENV_JOB_ID
from experiments.threads import THREAD_VARIABLES

pytestmark = pytest.mark.unit


def test_a_pickle_that_comes_late_is_waited_for_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "9_submitted.pkl"
    looks: list[float] = []

    def arrives_while_waiting(seconds: float) -> None:
        looks.append(seconds)
        submitit_utils.DelayedSubmission(json.loads, "[1, 2]").dump(path)

    monkeypatch.setattr(task.time, "sleep", arrives_while_waiting)
    call = task.load_call(path)
    assert looks == [task.PICKLE_LOOK_S], "it looked, waited once, then read"
    assert call.result() == [1, 2]


def test_a_pickle_that_never_comes_is_named(tmp_path: Path) -> None:
    path = tmp_path / "9_submitted.pkl"
    with pytest.raises(RuntimeError, match="9_submitted.pkl is still missing"):
        task.load_call(path, wait_s=0.0)


def test_a_pickle_of_something_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "9_submitted.pkl"
    submitit_utils.cloudpickle_dump({"not": "a call"}, path)
    with pytest.raises(RuntimeError, match="holds a dict"):
        task.load_call(path)


def test_the_folder_is_filled_in_as_submitit_fills_it() -> None:
    assert task.job_folder("/w/%j/submitit", "4711") == Path("/w/4711/submitit")
    assert task.job_folder("/w/d-%A-%a/submitit", "4711_3") == Path("/w/d-4711-3/submitit")
    assert task.job_folder("/w/r000/submitit", "12[3].pbs") == Path("/w/r000/submitit")


@pytest.mark.parametrize("environ,own", [
    ({"FAULTDRILL_JOB_ID": "4711_3", "SLURM_ARRAY_JOB_ID": "4711", "SLURM_ARRAY_TASK_ID": "3",
      "SLURM_JOB_ID": "4714"}, "4711_3"),
    ({"FAULTDRILL_JOB_ID": "4711_3", "SLURM_ARRAY_JOB_ID": "4711", "SLURM_ARRAY_TASK_ID": "4",
      "SLURM_JOB_ID": "4715"}, None),  # another element's
    ({"FAULTDRILL_JOB_ID": "88", "SLURM_JOB_ID": "88"}, "88"),
    ({"FAULTDRILL_JOB_ID": "12[3].pbs", "PBS_JOBID": "12[3].pbs"}, "12[3].pbs"),
    ({"FAULTDRILL_JOB_ID": "12[3]", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3",
      "SLURM_JOB_ID": "15"}, "12[3]"),  # under Slurm's PBS wrappers
    ({"FAULTDRILL_JOB_ID": "885", "SLURM_JOB_ID": "88"}, None),
    ({"FAULTDRILL_JOB_ID": "77", "SLURM_JOB_ID": "88"}, None),  # inherited from where the job was submitted
    ({"SLURM_JOB_ID": "88"}, None),
])
def test_only_this_jobs_own_id_is_taken(environ: dict[str, str], own: str | None) -> None:
    assert task.own_job_id(environ) == own


def test_submitits_runner_starts_with_the_ranks_thread_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: warm members under PBS ran submitit's runner, which loads NumPy (OpenBLAS's threads)
    before the rank's limits; the faulted run did other arithmetic than its twin. Every task, the
    local backend's (no scheduler id) included, goes through experiments/task.py, which sets them
    first; a value the task inherits still wins."""
    from submitit.core import submission

    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's
    monkeypatch.delenv(ENV_JOB_ID, raising=False)
    seen: dict[str, str | None] = {}
    monkeypatch.setattr(submission, "process_job",
                        lambda folder: seen.update({name: os.environ.get(name) for name in THREAD_VARIABLES}))
    task.main(["/jobs/%j"])
    assert seen == {**{name: "1" for name in THREAD_VARIABLES}, "OMP_NUM_THREADS": "4"}
