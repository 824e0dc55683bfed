"""Extra scheduler directives from the spec: parsed once, emitted the way sbatch and qsub parse them.

A directive is one option with an optional value, written as a user would type it on the command
line: ``--exclusive``, ``--account=ml``, ``--account ml``, ``-A ml``, ``-Aml``, ``-l mem=4gb``.
sbatch splits an ``#SBATCH`` line at blanks (honouring double quotes), so ``#SBATCH "-A ml"`` is one
word and ``#SBATCH --comment a b`` two options: long options are emitted as ``--opt=value`` and
short ones as ``-o value``, with the value in double quotes when it holds a blank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LONG = re.compile(r"^(--[A-Za-z][A-Za-z0-9-]*)(?:=(.*)|\s+(.*))?$", re.DOTALL)
_SHORT = re.compile(r"^(-[A-Za-z])\s*(.*)$", re.DOTALL)

# Options Faultdrill sets itself (and relies on), per backend: a user's copy would override them.
_NAME = "the job name is how a restarted controller finds its jobs"
_LOGS = "the logs go to the run's submitit folder"
_REQUEUE = ("Faultdrill sets it: off for every run (a requeued stale attempt would run again), on for "
            "restart.strategy requeue")
RESERVED: dict[str, dict[str, str]] = {
    "slurm": {
        "--job-name": _NAME, "-J": _NAME, "--output": _LOGS, "-o": _LOGS, "--error": _LOGS, "-e": _LOGS,
        "--requeue": _REQUEUE, "--no-requeue": _REQUEUE, "--array": "arrays come from submit_as_array",
        "-a": "arrays come from submit_as_array", "--nodes": "set resources.nodes", "-N": "set resources.nodes",
        "--ntasks-per-node": "set resources.tasks_per_node", "--time": "set resources.time",
        "-t": "set resources.time", "--partition": "set resources.partition", "-p": "set resources.partition",
        "--signal": ("Faultdrill sends the ranks the walltime's warning (SIGUSR2) itself: set resources.warning_s "
                     "(the seconds before the walltime)"),
    },
    "pbs": {
        "-N": _NAME, "-o": _LOGS, "-e": _LOGS, "-r": _REQUEUE, "-t": "arrays come from submit_as_array",
        "-J": "arrays come from submit_as_array", "-q": "set resources.partition (the PBS queue)",
    },
}
CLUSTER_OPTIONS = ("--clusters", "--cluster", "-M")


class DirectiveError(ValueError):
    """A directive that cannot be passed to the scheduler as written."""


@dataclass(frozen=True)
class Directive:
    flag: str  # "--account" or "-A"
    value: str | None  # None: a switch such as --exclusive

    @property
    def is_long(self) -> bool:
        return self.flag.startswith("--")


def parse_directive(text: str) -> Directive:
    """``text`` as one option and its value; raises DirectiveError naming what is wrong."""
    stripped = text.strip()
    if "\n" in stripped or "\r" in stripped:
        raise DirectiveError(f"directive {text!r} holds a line break; one directive per item")
    if '"' in stripped:
        raise DirectiveError(f"directive {text!r} holds a double quote, which #SBATCH lines cannot carry")
    match = _LONG.match(stripped) or _SHORT.match(stripped)
    if match is None:
        raise DirectiveError(
            f"directive {text!r} is not an option; write it as on the command line: '--exclusive', "
            "'--account=ml', '--account ml', '-A ml' or '-l mem=4gb'"
        )
    flag = match.group(1)
    value = next((group for group in match.groups()[1:] if group), None)
    return Directive(flag, value.strip() if value is not None else None)


def reserved_problem(text: str, backend: str) -> str | None:
    """Why ``text`` may not be an extra directive on ``backend`` (an option Faultdrill sets), or None."""
    flag = parse_directive(text).flag
    reserved = RESERVED.get(backend, {})
    # getopt_long takes any unambiguous prefix of a long option (--job-n, --requ, --out): so does this.
    prefixed = [option for option in reserved if flag.startswith("--") and len(flag) > 2 and option.startswith(flag)]
    named: str | None = flag if flag in reserved else (prefixed[0] if prefixed else None)
    if named is None:
        return None
    shown = flag if named == flag else f"{flag} (read as {named})"
    return f"directive {text!r}: {shown} is set by Faultdrill on {backend} ({reserved[named]})"


def slurm_line(directive: Directive) -> str:
    """The text after ``#SBATCH``: ``--opt=value``, ``-o value``, the value quoted if it has blanks."""
    if directive.value is None:
        return directive.flag
    value = f'"{directive.value}"' if re.search(r"\s|'|\\", directive.value) else directive.value
    return f"{directive.flag}={value}" if directive.is_long else f"{directive.flag} {value}"


def qos_of(directives: list[str]) -> str | None:
    """The QOS the job asks for (``--qos=X``, ``-q X``), if any."""
    for text in directives:
        directive = parse_directive(text)
        if directive.flag in ("--qos", "-q") and directive.value:
            return directive.value
    return None


def cluster_of(directives: list[str]) -> str | None:
    """The Slurm cluster(s) the job is sent to (``--clusters=X``, ``-M X``), if any."""
    for text in directives:
        directive = parse_directive(text)
        if directive.flag in CLUSTER_OPTIONS and directive.value:
            return directive.value
    return None
