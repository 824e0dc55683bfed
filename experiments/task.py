"""What each task of a Slurm or PBS job runs: ``python -u -m experiments.task FOLDER``.

The job was submitted through submitit, which pickled the call every task makes
(``<FOLDER>/<job id>_submitted.pkl``: ``run_rank(job)``, experiments/entry.py). submitit's own task
runner (``python -m submitit.core._submit FOLDER``) loads the submitit package, NumPy first ("to
avoid unexpected interactions", with OpenBLAS's threads started before the rank's thread limits)
and asyncio: ~0.3 s of CPU a task, most of what a short job of a sweep cost (issue 24, goal 4).
This runs the same pickled call with the standard library alone:

- the job is the one the batch script names (``FAULTDRILL_JOB_ID``, submitit's id of it, exported
  before the launch, and of this job: it starts with the scheduler's id of it); its folder's
  ``%j``/``%A``/``%a`` filled in as submitit fills them; its pickle is waited for as submitit waits
  (an array element may start before the controller has moved its pickle into place), at a short
  interval; ``SUBMITIT_FOLDER`` set as submitit sets it (a script's ``submitit.JobEnvironment()``);
- the pickle is read with submitit's ``DelayedSubmission`` class stood in for by a plain holder of
  its attributes (nothing of submitit's is imported; any other class is looked up as pickle does);
- the call's outcome is written where submitit writes it (``<job id>_<task>_result.pkl``,
  ``("success", result)`` or ``("error", traceback)``), so that submitit's ``job.result()`` reads it;
- an exception is re-raised (exit 1) and a ``SystemExit`` passes through (the rank's own exit code).

Without ``FAULTDRILL_JOB_ID`` (a user's template that does not export it), or with one that is not
this job's (inherited from where the job was submitted), submitit's runner runs the job instead:
slower, the same outcome (the rank's thread limits set first: they must precede its NumPy). The
local backend's tasks take that way (no scheduler id).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from experiments.layout import ENV_JOB_ID
from experiments.threads import limit_threads

PICKLE_WAIT_S = 60.0  # as submitit's runner
PICKLE_LOOK_S = 0.05
DELAYED_SUBMISSION = ("submitit.core.utils", "DelayedSubmission")


class PickledCall:
    """Stands in for submitit's DelayedSubmission when its pickle is read: its attributes only."""

    function: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def result(self) -> Any:
        return self.function(*self.args, **self.kwargs)


class _CallUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == DELAYED_SUBMISSION:
            return PickledCall
        return super().find_class(module, name)


def submitted_pickle(folder: Path, job_id: str) -> Path:
    """submitit's name of a job's pickled call (``JobPaths.submitted_pickle``)."""
    return folder / f"{job_id}_submitted.pkl"


def result_pickle(folder: Path, job_id: str, task: int) -> Path:
    """submitit's name of a task's outcome (``JobPaths.result_pickle``)."""
    return folder / f"{job_id}_{task}_result.pkl"


def load_call(path: Path, wait_s: float = PICKLE_WAIT_S) -> PickledCall:
    """The pickled call at ``path``, waited for up to ``wait_s`` (RuntimeError past that)."""
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"waited {wait_s:g} s for the job's pickled call, and {path} is still missing")
        time.sleep(PICKLE_LOOK_S)
    with path.open("rb") as handle:
        call = _CallUnpickler(handle).load()
    if not isinstance(call, PickledCall):
        raise RuntimeError(f"{path} holds a {type(call).__name__}, not submitit's pickled call")
    return call


def write_outcome(path: Path, outcome: tuple[str, Any]) -> None:
    """The task's outcome, whole or not at all (a temporary name, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as handle:
        pickle.dump(outcome, handle, pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def task_index() -> int:
    """This task's place in the job, as submitit names its files (the global rank)."""
    from experiments.runtime.distenv import DistEnv

    return DistEnv.from_environ().rank


def job_folder(folder: str, job_id: str) -> Path:
    """The folder as submitit names it for ``job_id``: ``%j`` the job, ``%A``/``%a`` an array's id
    and element (``JobPaths``)."""
    array_id, _, index = job_id.partition("_")
    filled = folder.replace("%j", job_id).replace("%A", array_id)
    return Path(filled.replace("%a", index) if index else filled)


def own_job_id(environ: Mapping[str, str]) -> str | None:
    """The job id the batch script exported, if it is this job's: one of the ids the templates make
    of the scheduler's variables (a Slurm job, an array element, a PBS job, an element under Slurm's
    PBS wrappers); None otherwise."""
    named = environ.get(ENV_JOB_ID, "")
    array, index = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
    ids = {environ.get("SLURM_JOB_ID", ""), environ.get("PBS_JOBID", "")}
    if array and index:
        ids |= {f"{array}_{index}", f"{array}[{index}]"}
    return named if named and named in ids else None


def run_task(folder: Path, job_id: str) -> None:
    os.environ["SUBMITIT_FOLDER"] = str(folder)
    call = load_call(submitted_pickle(folder, job_id))
    try:
        task = task_index()
    except Exception:
        task = 0  # the call, which reads the same environment, says what is wrong with it
    try:
        result = call.result()
    except Exception:
        write_outcome(result_pickle(folder, job_id, task), ("error", traceback.format_exc()))
        raise
    write_outcome(result_pickle(folder, job_id, task), ("success", result))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m experiments.task FOLDER (the job's submitit folder)")
    limit_threads()  # before submitit's runner, which imports NumPy (OpenBLAS reads them at load)
    job_id = own_job_id(os.environ)
    if job_id is None:
        from submitit.core.submission import process_job

        process_job(args[0])
        return
    run_task(job_folder(args[0], job_id), job_id)


if __name__ == "__main__":
    main()
