"""The one wrapper through which every scheduler command runs.

Argument lists only (never a shell string), a timeout, bounded retries for transient failures,
and errors that carry the command, its exit code, stdout and stderr.
"""

from __future__ import annotations

import logging
import os
import pwd
import selectors
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

log = logging.getLogger(__name__)

# Exit codes that mean "the scheduler is busy or briefly unreachable": worth one more try.
# Slurm clients exit 1 for nearly everything, so retries are opt-in per call site.
DEFAULT_TIMEOUT_S = 30.0
_this_thread = threading.local()  # how many commands this thread has run: what one poll cost


def commands_run_here() -> int:
    """The number of commands this thread has started through ``run_command`` (tries included)."""
    return int(getattr(_this_thread, "count", 0))


@dataclass(frozen=True)
class CommandResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


class CommandError(RuntimeError):
    """A scheduler command failed; carries everything needed to understand why."""

    def __init__(self, args: Sequence[str], returncode: int | None, stdout: str, stderr: str, reason: str):
        self.command = tuple(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.reason = reason
        super().__init__(
            f"{reason}: {' '.join(self.command)!r} (exit code {returncode})\n"
            f"stdout: {stdout.strip()[-2000:]}\nstderr: {stderr.strip()[-2000:]}"
        )

    @property
    def summary(self) -> str:
        """One line for a ledger reason or a log: the command, how it failed and what it said last."""
        said = next((line.strip() for text in (self.stderr, self.stdout)
                     for line in reversed(text.splitlines()) if line.strip()), "")
        line = f"{self.command[0] if self.command else '?'}: {self.reason} (exit code {self.returncode})"
        return f"{line}: {said}"[:500] if said else line


def one_line(error: BaseException) -> str:
    """A short description of any error: a CommandError's summary, else its first line."""
    if isinstance(error, CommandError):
        return error.summary
    return (str(error).splitlines() or [type(error).__name__])[0][:500]


def run_command(
    args: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retries: int = 0,
    retry_delay_s: float = 0.5,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    answers: Collection[int] = (0,),
) -> CommandResult:
    """Run ``args`` (a list, never a shell string); retry up to ``retries`` times on failure.

    ``answers``: the exit codes that are an answer (e.g. qstat's "unknown job" for a finished job);
    any other exit code, or a timeout, is a failure and is retried. ``check`` says only what happens
    once the retries are spent: raise CommandError (True) or return the last failed result (False).
    """
    if isinstance(args, str):
        raise TypeError("run_command takes an argument list, not a shell string")
    attempts_left = retries + 1
    while True:
        attempts_left -= 1
        try:
            result = _run_once(args, timeout_s=timeout_s, cwd=cwd, env=env)
        except CommandError:
            if attempts_left <= 0:
                raise
            log.warning("command timed out, retrying: %s", args)
            time.sleep(retry_delay_s)
            continue
        if result.returncode in answers:
            return result
        if attempts_left <= 0:
            if not check:
                return result
            raise CommandError(args, result.returncode, result.stdout, result.stderr, "command failed")
        log.warning("command failed (exit %s), retrying: %s", result.returncode, args)
        time.sleep(retry_delay_s)


def _run_once(
    args: Sequence[str], *, timeout_s: float, cwd: Path | None, env: dict[str, str] | None
) -> CommandResult:
    start = time.monotonic()
    _this_thread.count = commands_run_here() + 1
    try:
        completed = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env, check=False
        )
    except FileNotFoundError as error:
        raise CommandError(args, None, "", str(error), "command not found") from error
    except subprocess.TimeoutExpired as error:
        raise CommandError(
            args, None, _text(error.stdout), _text(error.stderr), f"command timed out after {timeout_s:g} s"
        ) from error
    return CommandResult(
        args=tuple(args),
        returncode=completed.returncode,
        stdout=completed.stdout,
        stderr=completed.stderr,
        duration_s=time.monotonic() - start,
    )


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def current_user() -> str:
    """The user this process runs as (from its uid, not from $USER): whose jobs a look-up may match."""
    return user_name(os.geteuid())


def user_name(uid: int) -> str:
    """``uid``'s name (its number where the password database has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Conversation:
    """A command that answers line by line while it runs (an srun step the login node talks to):
    an argument list, never a shell string; ended when the conversation closes."""

    def __init__(self, args: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        if isinstance(args, str):
            raise TypeError("Conversation takes an argument list, not a shell string")
        self.args = tuple(args)
        _this_thread.count = commands_run_here() + 1
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: never full, never blocking it
        # Its output read from the pipe's descriptor into a buffer of our own: a buffered reader may
        # hold a whole line the descriptor no longer signals (two lines in one chunk).
        self._pending = b""
        try:
            self.process = subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=self._stderr, bufsize=0, cwd=cwd, env=env)
        except FileNotFoundError as error:
            self._stderr.close()
            raise CommandError(args, None, "", str(error), "command not found") from error

    def read_line(self, timeout_s: float) -> str:
        """The command's next line (without its end); CommandError if none comes in time."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        descriptor = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    raise self.failed(f"no answer within {timeout_s:g} s")
                chunk = os.read(descriptor, 65536)
                if not chunk:
                    raise self.failed("it ended")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def say(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except OSError as error:
            raise self.failed(f"it stopped listening ({error})") from error

    def close(self, timeout_s: float = 10.0) -> None:
        """Its input ends (it should exit); killed if it has not within ``timeout_s``."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def failed(self, why: str) -> CommandError:
        """The conversation is over (the command killed): why, with what it said on stderr."""
        self.process.kill()
        self.process.wait()
        self._stderr.seek(0)
        return CommandError(self.args, self.process.returncode, "", self._stderr.read()[-4000:], why)
