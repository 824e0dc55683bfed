"""``faultdrill doctor``: before the first drill on a site, what the drill will meet there — the
scheduler and its release, accounting and limits, a test job on the nodes (their Python and
framework, their clocks against the login node's, how late the login node sees their files), the
workdir's filesystem (flock, rename, its type), and which fault kinds can act as this user. Each
finding passes, warns (the drill runs, knowing or doing less: the detail says what) or fails, with
what to do."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from orchestrator.commands import CommandError
from orchestrator.doctor.checks import Check, Status, failed, passed
from orchestrator.doctor.filesystems import (
    check_checkpoint_directory,
    check_directory,
    check_ledger_directory,
    nearest_existing,
)
from orchestrator.doctor.marks import CheckpointMarks
from orchestrator.doctor.nodes import DISK_FULL_DEFAULT_MB, checkpoint_checks, cleanup_check, kind_checks, node_checks
from orchestrator.doctor.probe_job import NodeReport, PBSProbe, SlurmProbe, probe_local

DOCTOR_FOLDER = ".doctor"
SUBMIT_COMMANDS = {"slurm": "sbatch", "pbs": "qsub"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Site:
    """What the doctor is asked about: the spec's, or the command line's."""

    backend: str
    workdir: Path
    nodes: int = 1
    partition: str | None = None
    framework: str | None = None
    parallel_runs: int = 1
    extra_directives: tuple[str, ...] = ()  # the spec's (account, QOS, ...): the test job asks them too
    checkpoints: Path | None = None  # the spec's checkpoint.directory: its deepest directory without {run_id}
    container: str | None = None  # the spec's resources.container image (Slurm's pyxis)
    ledger_dir: Path | None = None  # the spec's ledger_dir: the ledger on the login node's own disk
    max_fill_mb: float = DISK_FULL_DEFAULT_MB  # the most the spec's disk-full faults fill


@dataclass(frozen=True)
class Diagnosis:
    site: Site
    checks: list[Check]
    nodes: list[NodeReport]

    @property
    def failed(self) -> bool:
        return any(check.status is Status.FAIL for check in self.checks)

    def document(self) -> dict[str, Any]:
        return {"backend": self.site.backend, "workdir": str(self.site.workdir),
                "checks": [check.to_dict() for check in self.checks],
                "nodes": [_node_dict(report) for report in self.nodes],
                "summary": {status.value: sum(1 for check in self.checks if check.status is status) for status in Status}}


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP while the doctor runs: raised where it runs, so that its cleanup runs (its
    files in the checkpoint directory removed, its test job cancelled)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted inside (once: a second one while the cleanup runs is
    ignored); the handlers found are back after. Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def diagnose(site: Site) -> Diagnosis:
    with stopped_by_signals():
        return _diagnose(site)


def _diagnose(site: Site) -> Diagnosis:
    checks = [*_scheduler_checks(site), *check_directory("workdir", site.workdir),
              *(check_checkpoint_directory(site.checkpoints) if site.checkpoints is not None else []),
              *(check_ledger_directory(site.ledger_dir) if site.ledger_dir is not None else [])]
    folder = site.workdir / DOCTOR_FOLDER / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    marks = CheckpointMarks(nearest_existing(site.checkpoints)) if site.checkpoints is not None else None
    try:
        with marks if marks is not None else nullcontext():
            reports = _probe(site, folder, marks)
            found = checkpoint_checks(marks, reports) if marks is not None else []
    except CommandError as error:
        checks.append(failed("test job", f"{error.summary} (its files: {folder})",
                             f"check that a one-node job of this partition starts, and that "
                             f"{SUBMIT_COMMANDS.get(site.backend, 'the backend')} works here"))
        return Diagnosis(site, [*checks, *(cleanup_check(marks) if marks is not None else [])], [])
    answered = [report.node for report in reports if report.facts is not None]
    checks.append(passed("test job", f"ran; {len(answered)} of {len(reports)} node(s) answered"
                                     + (f": {', '.join(answered)}" if answered else "")))
    diagnosis = Diagnosis(site, [*checks, *node_checks(reports, site.framework), *found,
                                 *(cleanup_check(marks) if marks is not None else []),
                                 *kind_checks(site.backend, reports, site.checkpoints or site.workdir,
                                              site.max_fill_mb)], reports)
    if not diagnosis.failed:  # kept for a look where something failed
        shutil.rmtree(folder, ignore_errors=True)
    return diagnosis


def _scheduler_checks(site: Site) -> list[Check]:
    if site.backend == "slurm":
        from orchestrator.doctor.slurm import scheduler_checks

        return scheduler_checks(site.parallel_runs, site.extra_directives, site.container)
    if site.backend == "pbs":
        from orchestrator.doctor.pbs import scheduler_checks as pbs_checks

        return pbs_checks(site.partition, site.parallel_runs)
    return [passed("scheduler", "the local backend: no scheduler (each job a process tree on this host)")]


def _probe(site: Site, folder: Path, marks: CheckpointMarks | None) -> list[NodeReport]:
    if site.backend == "local":
        return probe_local(folder, site.framework, marks)
    probe = SlurmProbe if site.backend == "slurm" else PBSProbe
    return probe(folder, site.nodes, site.partition, site.framework, site.extra_directives, marks).run()


def _node_dict(report: NodeReport) -> dict[str, Any]:
    facts = report.facts or {}
    return {"node": report.node, "python": facts.get("python"), "framework_version": facts.get("framework_version"),
            "clock_offset_s": report.clock.offset_s if report.clock else None,
            "clock_uncertainty_s": report.clock.uncertainty_s if report.clock else None,
            "visible_after_s": report.visible_after_s, "error": report.error or None}
