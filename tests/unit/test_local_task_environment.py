"""What a local task inherits: never a job id of the job the drill itself was started in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from experiments.layout import ENV_JOB_ID
from experiments.task import own_job_id
from orchestrator.backends.local import backend

pytestmark = pytest.mark.unit


def test_a_local_task_does_not_inherit_the_job_id_of_the_job_the_drill_runs_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the task command on the local backend: a drill started inside a Faultdrill job
    (FAULTDRILL_JOB_ID and SLURM_JOB_ID both its own) gave each local task that job's id; the task
    took it for its own and waited 60 s for a pickle that was never there."""
    monkeypatch.setenv(ENV_JOB_ID, "4242")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    started: dict[str, Any] = {}

    class Started:
        pid = 99999

        def __init__(self, argv: list[str], env: dict[str, str]) -> None:
            started.update(argv=argv, env=env)

    monkeypatch.setattr(backend.subprocess, "Popen", Started)
    executor = backend.EnvLocalExecutor(tmp_path / "submitit", {"FAULTDRILL_RUN_ID": "r000"})
    executor._submit_command(executor._submitit_command_str)
    assert ENV_JOB_ID not in started["env"] and started["env"]["FAULTDRILL_RUN_ID"] == "r000"
    assert own_job_id(started["env"]) is None, "the task runs submitit's runner, for the local job"
    assert "experiments.task" in started["env"]["SUBMITIT_LOCAL_COMMAND"]
