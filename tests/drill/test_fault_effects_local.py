"""Issue 23, item 1: a drill that is wrong must not end green. The user's own script (tests/step_trainer.py:
no framework, its own checkpoints and --resume), run by a wrapper that has a service start the trainer outside the rank's process tree (as a container
runtime's daemon would: tests/service_wrapper.sh, tests/trainer_service.py). A SIGKILL (kill-rank)
or a SIGSTOP (hang-rank) reaches the wrapper, never the trainer: it trains on and writes its own
checkpoints, and the next attempt resumes from one written after the fault. The report names the
fault ineffective (from the ranks' own records: the resume came from a step the attempt could not
have reached by the fault) and `drill` exits 6; with `allow_ineffective: true` it exits 0 and
still says so. A SIGSTOP for a while (stall-rank) stops only the wrapper and the log it shows: once
it is continued, the steps it tells have jumped further than the trainer's pace allows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from faultdrill_cli import FULL_ONLY

pytestmark = pytest.mark.drill

REPO = Path(__file__).resolve().parents[2]
DRILL_TIMEOUT_S = 300
EXIT_INEFFECTIVE = 6


@pytest.fixture
def trainer_service(tmp_path: Path) -> Iterator[Path]:
    """The service (this test's own process), its spool; stopped after, with every trainer it started."""
    spool = tmp_path / "spool"
    spool.mkdir()
    service = subprocess.Popen([sys.executable, str(REPO / "tests" / "trainer_service.py"), str(spool)])
    try:
        yield spool
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)


def _spec(tmp_path: Path, spool: Path, kind: str, allow: bool) -> Path:
    spec: dict[str, Any] = {
        "name": f"defeated-{kind}", "backend": "local", "workdir": str(tmp_path / "work"),
        "workload": {
            "command": ["bash", str(REPO / "tests" / "service_wrapper.sh"), str(spool), sys.executable,
                        str(REPO / "tests" / "step_trainer.py"), "--steps", "{steps}", "--step-s", "0.01",
                        "--save-every", "50", "--ckpt-dir", "{run_dir}/own-checkpoints"],
            # 1200 steps of 10 ms: the orphaned trainer is still training when the next attempt resumes
            "framework": "other", "steps": 1200, "progress": {"log": r"^step (\d+) "}, "resume_args": ["--resume"]},
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "faults": [{"kind": kind, "after": {"at_step": 220}, "rank": 0,
                    **({"duration_s": 2.0} if kind == "stall-rank" else {})}],
        # a resubmission waits 3 s (a queue's wait on a cluster): meanwhile the orphan trains on, and
        # the next attempt resumes from a checkpoint well past the fault
        "restart": {"max_restarts": 2, "poll_interval_s": 0.1, "hang_timeout_s": 3,
                    "policy": {"RANK_SIGNAL": {"backoff_s": 3}, "RANK_EXIT": {"backoff_s": 3}}},
        "allow_ineffective": allow,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# CI drills a kill and a stall (the two ways a wrapper keeps a signal from the trainer: it dies, or it
# stops); the hang (a kill's resume check again, with allow_ineffective) with FAULTDRILL_FULL=1.
@pytest.mark.parametrize(("kind", "allow"), [("kill-rank", False), pytest.param("hang-rank", True, marks=FULL_ONLY),
                                             ("stall-rank", False)])
def test_a_fault_a_wrapper_keeps_from_the_trainer_is_named_ineffective_and_fails_the_drill(
        tmp_path: Path, trainer_service: Path, kind: str, allow: bool) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "drill", str(_spec(tmp_path, trainer_service,
                                                                                          kind, allow)),
                           "--format", "json", "--no-html"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_S,
                          cwd=REPO)
    assert done.returncode == (0 if allow else EXIT_INEFFECTIVE), (done.returncode, done.stderr[-4000:])
    report = json.loads(done.stdout)
    [run] = report["runs"]
    assert run["status"] == "completed", run["attempts"]
    [fault] = run["faults"]
    assert fault["outcome"] == "injected", fault  # the injector's word: it did signal the rank it verified
    assert [finding["verdict"] for finding in run["findings"]] == ["ineffective"], run["findings"]
    assert report["verdict"] == {"ineffective": 1, "suspicious": 0, "allowed": allow, "believed": allow,
                                 "slo_met": 0, "slo_missed": 0}, report["verdict"]
    if kind == "stall-rank":  # the run goes on: its steps, told once the wrapper was continued, jumped
        assert "trained while stopped" in fault["effect"] and run["recoveries"] == [], fault["effect"]
    else:
        assert fault["effect"].startswith("ineffective: attempt 1 resumed from step"), fault["effect"]
        [recovery] = run["recoveries"]
        # the orphaned trainer's checkpoint, written after the fault: past the step the fault met
        assert recovery["resumed_from_step"] > fault["met_step"], (recovery["resumed_from_step"], fault["met_step"])
    assert time.monotonic() - started < DRILL_TIMEOUT_S
