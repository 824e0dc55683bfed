"""Render batch scripts from the Jinja templates in ``templates/`` (or a user template by path)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from experiments.layout import ENV_ATTEMPT, ENV_DRILL_ID, ENV_RUN_DIR, ENV_RUN_ID
from experiments.workloads import LAUNCHER_MPI
from orchestrator.runs import RunConfig

SLURM_TEMPLATE = "slurm.sbatch.j2"


class TemplateError(ValueError):
    """A template could not be rendered: names the template and the problem."""


def shell_quote(value: Any) -> str:
    return shlex.quote(str(value))


def directive_value(value: Any) -> str:
    """A value for a ``#SBATCH``/``#PBS`` line: one line; quoted when it holds blanks or quotes."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise TemplateError(f"directive value {text!r} holds a line break; directives are one line")
    if any(char in text for char in " \t'\"\\"):
        if '"' in text:
            raise TemplateError(f"directive value {text!r} holds a double quote, which sbatch cannot parse")
        return f'"{text}"'
    return text


def _environment(user_template: Path | None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = [jinja2.PackageLoader("templates", ".")]
    if user_template is not None:
        loaders.insert(0, jinja2.FileSystemLoader(str(user_template.parent)))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["directive"] = directive_value
    return env


def render_template(name: str, context: dict[str, Any], user_template: Path | None = None) -> str:
    env = _environment(user_template)
    template_name = user_template.name if user_template is not None else name
    try:
        return env.get_template(template_name).render(**context)
    except jinja2.UndefinedError as error:
        raise TemplateError(f"template {template_name}: {error.message} (variables: {sorted(context)})") from None
    except jinja2.TemplateError as error:
        raise TemplateError(f"template {template_name}: {error}") from None


@dataclass(frozen=True)
class SubmissionScript:
    """A rendered batch script and what it needs to run: submit it from ``submit_dir``."""

    text: str
    submit_dir: Path
    environment: dict[str, str] = field(default_factory=dict)


# OpenMPI refuses to start as root without these; the local cluster runs jobs as root.
MPI_ENVIRONMENT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def rank_environment(run: RunConfig, attempt: int, drill_id: str) -> dict[str, str]:
    """What every rank process of the attempt is started with (the injector checks the first two)."""
    environment = {
        ENV_RUN_ID: run.run_id,
        ENV_RUN_DIR: str(run.paths.root),
        ENV_ATTEMPT: str(attempt),
        ENV_DRILL_ID: drill_id,
        **dict(run.workload_entry.environment),
    }
    if run.workload_entry.launcher == LAUNCHER_MPI:
        environment.update(MPI_ENVIRONMENT)
    return environment


def attempt_job_name(run: RunConfig, attempt: int) -> str:
    """Unique per campaign, run and attempt: a restarted controller finds an unrecorded job by it."""
    return f"{run.job_name}-a{attempt}"


def submitit_command(folder: Path, python: str = sys.executable) -> list[str]:
    return [python, "-u", "-m", "submitit.core._submit", str(folder)]


def render_slurm(run: RunConfig, attempt: int, drill_id: str, python: str = sys.executable) -> SubmissionScript:
    resources = run.campaign.resources
    environment = {**rank_environment(run, attempt, drill_id), "SUBMITIT_EXECUTOR": "slurm"}
    context = {
        "job_name": attempt_job_name(run, attempt),
        "nodes": resources.nodes,
        "tasks_per_node": resources.tasks_per_node,
        "time": resources.time,
        "partition": resources.partition,
        "extra_directives": resources.extra_directives,
        "stdout_name": "%j_batch.out",
        "stderr_name": "%j_batch.err",
        "rank_output": "%j_%t_log.out",
        "rank_error": "%j_%t_log.err",
        "environment": environment,
        "events_file": str(run.paths.events_file(attempt)),
        "command": submitit_command(run.paths.submitit, python),
        "mpi": run.workload_entry.launcher == LAUNCHER_MPI,
    }
    text = render_template(SLURM_TEMPLATE, context, run.campaign.template)
    return SubmissionScript(text=text, submit_dir=run.paths.submitit, environment=environment)
