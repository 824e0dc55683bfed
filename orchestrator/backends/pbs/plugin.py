"""PBS for submitit: an executor plugin (entry-point group ``submitit``), its job class with a
batched ``qstat -f`` watcher, and the job environment inside a PBS job.

Registered in pyproject.toml, so ``submitit.AutoExecutor(folder, cluster="pbs")`` finds it. submitit
loads this module in every job of every executor (to pick a job environment), so it imports only the
standard library, submitit and the PBS command layer; the template renderer is imported when a
script is made, on the login node. Ids and the wrappers' quirks: see ``orchestrator.backends.pbs.commands``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from submitit.core import core, job_environment, utils
from submitit.slurm.slurm import _parse_node_list

from orchestrator.backends.pbs.commands import (
    QSTAT_TIMEOUT_S,
    array_element_id,
    parse_qstat_full,
    parse_qsub,
    qdel,
    qstat_states,
    qsub,
    record_state,
)
from orchestrator.commands import CommandError, run_command
from orchestrator.states import JobState

log = logging.getLogger(__name__)


# --- submitit: job and watcher -----------------------------------------------------------------


class PBSInfoWatcher(core.InfoWatcher):
    """Every registered job's state from one ``qstat -f`` per update."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s)
        self.folders: dict[str, Path] = {}

    def _make_command(self) -> list[str] | None:
        ids = sorted(self._registered - self._finished)
        return ["qstat", "-f", *ids] if ids else None

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        return {job_id: {**record, "State": record_state(job_id, record, self.folders.get(job_id)).value}
                for job_id, record in parse_qstat_full(text).items()}

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode=mode).get("State") or JobState.UNKNOWN.value

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return JobState(self.get_state(job_id, mode=mode)).is_terminal

    def update(self) -> None:
        to_check = sorted(self._registered - self._finished)
        if not to_check:
            return
        self._num_calls += 1
        try:
            states = qstat_states(to_check, self.folders)
        except CommandError as error:
            log.warning("qstat call #%d failed, states may be stale: %s", self._num_calls, error)
        else:
            for job_id, state in states.items():
                self._info_dict[job_id] = {"State": state.value}
        self._last_status_check = time.time()
        self._finished.update(job_id for job_id in to_check if self.is_done(job_id, mode="cache"))


class PBSJob(core.Job[core.R]):
    _cancel_command = "qdel"
    watcher = PBSInfoWatcher(delay_s=60)

    def _register_in_watcher(self) -> None:
        if not self._tasks[0]:
            self.watcher.register_job(self.job_id)
            self.watcher.folders[self.job_id] = self.paths.folder

    def cancel(self, check: bool = True) -> None:
        qdel(self.job_id, self.paths.folder)


# --- submitit: inside the job ------------------------------------------------------------------


def _first_int(names: Sequence[str], default: int) -> int:
    for name in names:
        raw = os.environ.get(name, "")
        if raw.strip().lstrip("-").isdigit():
            return int(raw)
    return default


class PBSJobEnvironment(job_environment.JobEnvironment):
    """Where this task is: PBS's variables first, an MPI launcher's for rank and size; under Slurm's
    PBS wrappers (PBS_JOBID and PBS_NODEFILE empty) Slurm's variables stand in."""

    _env = {"job_id": "PBS_JOBID", "array_task_id": "PBS_ARRAY_INDEX"}

    @property
    def raw_job_id(self) -> str:
        """The scheduler's id for this job (a wrapper array element has a Slurm id of its own)."""
        for name in ("PBS_JOBID", "SLURM_JOB_ID"):
            if os.environ.get(name):
                return os.environ[name]
        raise RuntimeError("not inside a PBS job: neither PBS_JOBID nor SLURM_JOB_ID is set")

    @property
    def job_id(self) -> str:
        """As the login side names it: PBS_JOBID (``123[4].server`` for an element), else
        ``<SLURM_ARRAY_JOB_ID>[<SLURM_ARRAY_TASK_ID>]`` or SLURM_JOB_ID."""
        if os.environ.get("PBS_JOBID"):
            return os.environ["PBS_JOBID"]
        if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
            return f"{os.environ['SLURM_ARRAY_JOB_ID']}[{os.environ['SLURM_ARRAY_TASK_ID']}]"
        return self.raw_job_id

    @property
    def array_job_id(self) -> str | None:
        if self.array_task_id is None:
            return None
        return os.environ.get("PBS_ARRAY_ID") or self.job_id.replace(f"[{self.array_task_id}]", "[]", 1)

    @property
    def array_task_id(self) -> str | None:
        names = ("PBS_ARRAY_INDEX", "PBS_ARRAYID", "SLURM_ARRAY_TASK_ID")
        return next((os.environ[name] for name in names if os.environ.get(name)), None)

    @property
    def global_rank(self) -> int:
        return _first_int(("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "PBS_VNODENUM", "SLURM_PROCID"), 0)

    @property
    def local_rank(self) -> int:
        return _first_int(("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"), 0)

    @property
    def num_tasks(self) -> int:
        return _first_int(("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PBS_NP"), 0) or len(self._node_slots()) or \
            _first_int(("SLURM_NTASKS",), 1)

    @property
    def hostnames(self) -> list[str]:
        """Distinct hosts of PBS_NODEFILE, else of Slurm's node list, else this host."""
        slots = self._node_slots()
        if slots:
            return list(dict.fromkeys(slots))
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
        return _parse_node_list(nodelist) if nodelist else [self.hostname]

    @property
    def num_nodes(self) -> int:
        return _first_int(("PBS_NUM_NODES",), 0) or len(self.hostnames)

    @property
    def node(self) -> int:
        short = [host.split(".")[0] for host in self.hostnames]
        here = self.hostname.split(".")[0]
        return short.index(here) if here in short else _first_int(("SLURM_NODEID",), 0)

    def _node_slots(self) -> list[str]:
        nodefile = os.environ.get("PBS_NODEFILE", "")
        try:
            return Path(nodefile).read_text().split() if nodefile else []
        except OSError:  # written on the first node only, and this is another
            return []

    def _requeue(self, countdown: int) -> None:
        run_command(["qrerun", self.raw_job_id], timeout_s=QSTAT_TIMEOUT_S)
        log.info("requeued job %s (%d timeouts left)", self.job_id, countdown)


# --- submitit: the executor --------------------------------------------------------------------

PBS_DEFAULTS: dict[str, Any] = {
    "job_name": "submitit", "nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "gpus_per_node": 0,
    "timeout_min": 5, "mem_gb": None, "queue": None, "flavor": "torque", "rerunnable": True,
    "array_parallelism": 256, "extra_directives": [], "stderr_to_stdout": False,
}


class PBSExecutor(core.PicklingExecutor):
    """Submits through ``qsub`` with Faultdrill's ``templates/pbs.j2``; ranks start under mpiexec.

    Parameters (``update_parameters``): ``job_name``, ``nodes``, ``tasks_per_node``, ``cpus_per_task``,
    ``gpus_per_node``, ``timeout_min``, ``mem_gb`` (per node), ``queue``, ``flavor`` ("torque" or
    "pro": the directive syntax), ``rerunnable``, ``array_parallelism`` (throttle of map_array),
    ``extra_directives`` (e.g. ["-A myproject", "-l software=x"]). ``folder`` may hold ``%j``.
    """

    job_class = PBSJob

    def __init__(self, folder: str | Path, max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0,
                 python: str | None = None) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb)
        self.python = python or sys.executable

    @classmethod
    def _equivalence_dict(cls) -> core.EquivalenceDict:
        return {"name": "job_name", "timeout_min": "timeout_min", "mem_gb": "mem_gb", "nodes": "nodes",
                "cpus_per_task": "cpus_per_task", "gpus_per_node": "gpus_per_node",
                "tasks_per_node": "tasks_per_node"}

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(PBS_DEFAULTS)

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(PBS_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown PBS parameter(s) {unknown}; valid: {', '.join(sorted(PBS_DEFAULTS))}")
        if kwargs.get("flavor", "torque") not in ("torque", "pro"):
            raise ValueError(f"flavor {kwargs['flavor']!r}: valid are 'torque' and 'pro'")
        super()._internal_update_parameters(**kwargs)

    @classmethod
    def affinity(cls) -> int:
        """Available with qsub; below Slurm's executor where srun exists too (the Torque wrappers)."""
        if shutil.which("qsub") is None:
            return -1
        return 1 if shutil.which("srun") else 2

    @property
    def _submitit_command_str(self) -> str:
        return f"{self.python} -u -m submitit.core._submit {self.folder}"

    def _num_tasks(self) -> int:
        return int(self._parameter("nodes")) * int(self._parameter("tasks_per_node"))

    def _parameter(self, name: str) -> Any:
        return self.parameters.get(name, PBS_DEFAULTS[name])

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        from orchestrator.render.scripts import PBS_TEMPLATE, PBSElement, PBSScriptRequest, render_template

        get = self._parameter
        count = self.parameters.get("map_count")
        minutes = int(get("timeout_min"))
        mem = f"{int(get('mem_gb') * 1024)}mb" if get("mem_gb") else None
        request = PBSScriptRequest(
            job_name=re.sub(r"[^A-Za-z0-9_.-]", "_", str(get("job_name"))), nodes=int(get("nodes")),
            tasks_per_node=int(get("tasks_per_node")), walltime=f"{minutes // 60:02d}:{minutes % 60:02d}:00",
            elements=tuple(PBSElement(folder=self.folder, index=index) for index in (range(count) if count else [None])),
            python=self.python, flavor=get("flavor"), queue=get("queue"), mem=mem, rerunnable=bool(get("rerunnable")),
            array=f"0-{count - 1}%{min(count, int(get('array_parallelism')))}" if count else None,
            extra_directives=tuple(get("extra_directives")), cpus_per_task=int(get("cpus_per_task")),
            gpus_per_node=int(get("gpus_per_node")),
            output_stem=f"pbs-{uid}",
        )
        return render_template(PBS_TEMPLATE, request.context())

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["qsub", submission_file_path.name]

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        return parse_qsub(string.decode() if isinstance(string, bytes) else string)

    def _submit_command(self, command: str) -> core.Job[Any]:
        uid = uuid.uuid4().hex
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / f".submission_file_{uid}.sh"
        text = self._make_submission_file_text(command, uid)
        script.write_text(text)
        job_id = qsub(script.name, text, folder)
        job: core.Job[Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script, "submission_file", keep_as_symlink=False)
        return job

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job[Any]]:
        """Several submissions are one array: element i unpickles submission i (``<id>[i]``)."""
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = []
        for delayed in delayed_submissions:
            path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(self._parameter("timeout_min"), self.max_num_timeout)
            delayed.dump(path)
            pickles.append(path)
        array = PBSExecutor(self.folder, self.max_num_timeout, python=self.python)
        array.update_parameters(**self.parameters)
        array.parameters["map_count"] = len(pickles)
        self._throttle()
        first = array._submit_command(self._submitit_command_str)
        jobs: list[core.Job[Any]] = [PBSJob(folder=self.folder, job_id=array_element_id(first.job_id, index),
                                            tasks=list(range(first.num_tasks))) for index in range(len(pickles))]
        for job, path in zip(jobs, pickles, strict=False):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


