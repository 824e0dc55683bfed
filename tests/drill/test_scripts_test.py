"""scripts/test's own control flow (the README's second command, CI's entry): run as it is, in a copy
of the repository's layout whose commands are stand-ins (python -m pytest, mypy, ruff, the cluster),
each noting what it was asked and how it ended. What is tested is the script: which tiers start
when, that a failed unit tier stops the cluster lane, and that an interrupt or a TERM (a cancelled
CI job) stops every tier's pytest at once, lets it tear down, and ends the run."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rank_launch import wait_for

pytestmark = pytest.mark.drill

REPO = Path(__file__).resolve().parents[2]

# "python -m pytest ...": which tier from its arguments; sleeps STAND_IN_<tier> seconds and exits
# STAND_IN_<tier>_RC; a TERM is an interrupt (as tests/conftest.py makes it for pytest).
PYTHON = textwrap.dedent('''\
    #!/usr/bin/python3 -S
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = " ".join(sys.argv[1:])
    tier = ("cluster" if "-m cluster" in args else "crash" if "pytest tests/unit/test_crash_points" in args else
            "unit" if "tests/unit" in args else "drill" if "-m drill" in args else "other")
    def note(what):
        with open(os.environ["STAND_IN_LOG"], "a") as log:
            log.write(f"{tier} {what}\\n")
    note("start")
    try:
        time.sleep(float(os.environ.get(f"STAND_IN_{tier}", "0.2")))
    except KeyboardInterrupt:
        note("interrupted")
        sys.exit(2)
    note("end")
    sys.exit(int(os.environ.get(f"STAND_IN_{tier}_RC", "0")))
''')
CLUSTER = '#!/bin/sh\necho "cluster $1" >>"$STAND_IN_LOG"; [ "$1" = status ] && exit 1; exit 0\n'
SUCCEEDS = "#!/bin/sh\nexit 0\n"


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Path]:
    """The repository's scripts/test in a tree whose commands are stand-ins; each run of it in a
    session of its own, whose processes are killed at the end (a failed test leaves no stand-in)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "scripts" / "test").write_text((REPO / "scripts" / "test").read_text())
    for path, text in {"scripts/cluster": CLUSTER, "scripts/install-deps": SUCCEEDS, "scripts/setup-venv": SUCCEEDS,
                       ".venv/bin/python": PYTHON, ".venv/bin/ruff": SUCCEEDS, ".venv/bin/mypy": SUCCEEDS}.items():
        (tmp_path / path).write_text(text)
    for path in [*(tmp_path / "scripts").iterdir(), *(tmp_path / ".venv" / "bin").iterdir()]:
        path.chmod(0o755)
    yield tmp_path
    for line in (tmp_path / "sessions").read_text().split() if (tmp_path / "sessions").exists() else []:
        try:
            os.killpg(int(line), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _start(layout: Path, **seconds: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = layout / "stand-ins.log"
    log.touch()
    (layout / "tmp").mkdir(exist_ok=True)  # the script's mktemp: its lanes' logs
    env = {**os.environ, "STAND_IN_LOG": str(log), "TMPDIR": str(layout / "tmp"),
           **{f"STAND_IN_{k}": v for k, v in seconds.items()}}
    script = subprocess.Popen(["bash", str(layout / "scripts" / "test")], cwd=layout, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_own_session)
    with open(layout / "sessions", "a") as sessions:
        sessions.write(f"{script.pid}\n")
    return script, log


def _own_session() -> None:
    """The script in a session of its own, SIGINT as a shell at a terminal gets it: CI's drill lane
    is a background job of scripts/test, which ignores SIGINT, and a signal ignored when bash starts
    cannot be trapped (the interrupt case timed out there)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _noted(log: Path) -> list[str]:
    return log.read_text().splitlines()


def test_the_cluster_lane_runs_beside_the_unit_tier_and_the_drill_lane_after_it(layout: Path) -> None:
    script, log = _start(layout, unit="0.5", crash="0.5", cluster="2", drill="0.5")
    assert script.wait(timeout=60) == 0
    noted = _noted(log)
    assert noted.index("cluster start") < noted.index("unit end") < noted.index("drill start"), noted
    assert noted[-1] == "cluster down" and {"cluster end", "drill end", "crash end"} <= set(noted), noted


def test_a_failed_unit_tier_stops_the_cluster_lane_and_starts_no_drill_lane(layout: Path) -> None:
    script, log = _start(layout, unit="0.5", unit_RC="1", crash="0.5", cluster="60")
    assert script.wait(timeout=30) == 1
    noted = _noted(log)
    assert "cluster interrupted" in noted and "drill start" not in noted and noted[-1] == "cluster down", noted


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_run_stops_every_tier_at_once_and_ends(layout: Path, signum: int, status: int) -> None:
    """A cancelled CI job sends TERM to the script: before, the trap waited for the unit tier to end,
    stopped the cluster lane, and the drill tier then ran whole."""
    script, log = _start(layout, unit="60", crash="60", cluster="60", drill="60")
    wait_for(lambda: {"unit start", "crash start", "cluster start"} <= set(_noted(log)), 30,
             "the unit tier and the cluster lane to start")
    script.send_signal(signum)
    assert script.wait(timeout=15) == status
    noted = _noted(log)
    assert {"unit interrupted", "crash interrupted", "cluster interrupted"} <= set(noted), noted
    assert "drill start" not in noted and noted[-1] == "cluster down", noted
    left = [path.name for path in (layout / "tmp").iterdir()]
    assert not left, f"the lanes' logs were left behind: {left}"
