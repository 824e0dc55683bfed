"""A look-up by job name matches only the user's own jobs (security issue 28, item 3): job names
are public, and after a failed qsub or a controller restart the drill adopted a stranger's job of
that name (the fence then named it) and qdel'ed its own as "the duplicate". Recorded scheduler
output; the look-up's own commands captured."""

from __future__ import annotations

import pytest

import orchestrator.backends.pbs.backend as pbs_backend
import orchestrator.backends.pbs.commands as pbs_commands
from orchestrator.backends.pbs.backend import PBSBackend
from orchestrator.backends.pbs.commands import ServerKind
from orchestrator.commands import CommandResult, current_user

pytestmark = pytest.mark.unit

NAME = "fd-d1-r000-a0"


@pytest.mark.parametrize(("server", "extra"), [(ServerKind.PRO, ["-x"]), (ServerKind.TORQUE, [])])
def test_the_servers_look_up_selects_the_users_jobs_only(monkeypatch: pytest.MonkeyPatch, server: ServerKind,
                                                         extra: list[str]) -> None:
    """qselect -u: the server selects by owner and name (it was a qstat -f of every job, filtered here)."""
    asked: list[list[str]] = []

    def qselect(argv: list[str], **_: object) -> CommandResult:
        asked.append(argv)
        return CommandResult(args=tuple(argv), returncode=0, stdout="102.server\n105[3].server\n", stderr="",
                             duration_s=0.0)

    monkeypatch.setattr(pbs_backend, "detect_server", lambda: server)
    monkeypatch.setattr(pbs_commands, "run_command", qselect)
    assert PBSBackend("d1")._named(NAME) == {"102.server", "105[].server"}, "an element stands for its array"
    assert asked == [["qselect", "-u", current_user(), "-N", NAME, *extra]]


def test_the_slurm_wrappers_look_up_asks_for_the_users_jobs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def squeue(argv: list[str], **_: object) -> CommandResult:
        asked.append(argv)
        return CommandResult(args=tuple(argv), returncode=0, stdout="77\n", stderr="", duration_s=0.0)

    monkeypatch.setattr(pbs_backend, "detect_server", lambda: ServerKind.SLURM_WRAPPERS)
    monkeypatch.setattr(pbs_backend, "run_command", squeue)
    assert PBSBackend("d1")._named(NAME) == {"77"}
    [argv] = asked
    assert argv[argv.index("-u") + 1] == current_user() and argv[argv.index("-n") + 1] == NAME
