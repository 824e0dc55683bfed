"""``faultdrill``: submit sweeps, rehearse failures and measure what a failure costs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from injectors.schedule import PlannedFault
from orchestrator.campaign.runs import RunConfig, expand_runs
from orchestrator.campaign.spec import Campaign, SpecError, load_campaign, parse_campaign
from orchestrator.control.detach import ControllerBusy, live_controller
from orchestrator.project import command as project_command
from orchestrator.record.ledger import LedgerBusy
from orchestrator.record.ledger_home import LedgerElsewhere, has_ledger
from orchestrator.render.scripts import TemplateError, render_pbs, render_slurm
from orchestrator.report.advise import AdviceError
from orchestrator.report.document import ReportError, build_report
from orchestrator.report.html import REPORT_DIR
from orchestrator.report.tables import print_report, report_console

EXIT_SPEC = 2  # the spec (or the workdir) cannot be used; nothing was submitted
EXIT_SCHEDULER = 3  # the scheduler stopped answering; the drill stopped, its jobs left as they are
EXIT_STOPPED = 4  # the controller was stopped (faultdrill stop); its jobs left for the next drill
EXIT_NO_CONTROLLER = 1  # stop: no controller drives the workdir
EXIT_SLO_MISSED = 5  # a resilience objective of the spec (slo:) was missed, or had nothing to measure
EXIT_INEFFECTIVE = 6  # a fault was ineffective or a run's record suspicious (the report's findings)
EXIT_PIPE = 141  # the reader of our output went away (128 + SIGPIPE, as a shell reports it)
DRY_RUN_DRILL_ID = "(dry-run)"


def _version() -> str:
    try:
        return metadata.version("faultdrill")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _scope_arguments(command: argparse.ArgumentParser) -> None:
    """The tables a report shows: those that matter for the drill, the study's too, or every one;
    and where to write its objectives' results as JUnit XML."""
    command.add_argument("--junit", type=Path, metavar="FILE",
                         help="write the spec's resilience objectives (slo:) as JUnit XML: one test case per run and "
                              "bound, a missed one a failure (GitLab, Jenkins and GitHub show it)")
    scope = command.add_mutually_exclusive_group()
    scope.add_argument("--study", dest="scope", action="store_const", const="study", default="drill",
                       help="the checkpoint study's tables too (shown anyway for a campaign that is a study: a "
                            "sweep over frameworks, model sizes or scales)")
    scope.add_argument("--full", dest="scope", action="store_const", const="full", help="every table")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultdrill", description=(__doc__ or "").replace("``", ""))
    parser.add_argument("--version", action="version", version=f"faultdrill {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every decision of the controller")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec_help = "the campaign spec (YAML); relative paths in it are relative to its folder"
    validate = sub.add_parser("validate", help="check a spec and list its runs; submits nothing",
                              description="Check a spec (every sweep point and planned fault) and list its runs.")
    validate.add_argument("spec", type=Path, help=spec_help)
    plan = sub.add_parser("plan", help="print every run's planned faults (kind, target, when); submits nothing",
                          description="Print, for every run, each planned fault: kind, target, anchor and delay (or "
                                      "step). The plan is seeded: the same spec gives the same plan. Contacts no "
                                      "scheduler and touches nothing.")
    plan.add_argument("spec", type=Path, help=spec_help)
    render = sub.add_parser("render", help="print what every run would submit (dry run); submits nothing",
                            description="Print each run's batch script (Slurm, PBS), or what the local backend runs.")
    render.add_argument("spec", type=Path, help=spec_help)
    drill = sub.add_parser("drill", help="run a campaign to the end, then print its report",
                           description="Run a campaign with its faults to the end, then print the report; "
                                       "exit code 1 if a run did not complete. Resumes an unfinished drill.")
    drill.add_argument("spec", type=Path, help=spec_help)
    drill.add_argument("--format", choices=("table", "json"), default="table", help="report as tables or one JSON document")
    _scope_arguments(drill)
    drill.add_argument("--dry-run", action="store_true", help="print the fault plan (as `faultdrill plan`) and stop")
    drill.add_argument("--no-html", action="store_true",
                       help=f"write no report page (by default: WORKDIR/{REPORT_DIR}/index.html, with plots)")
    drill.add_argument("--detach", action="store_true",
                       help="run the controller in the background (log and pid in the workdir) and return; "
                            "see it with `faultdrill status WORKDIR`")
    workdir_help = "the campaign's workdir (holds ledger.sqlite), or its spec"
    status = sub.add_parser("status", help="show a drill's live progress (a detached one too)",
                            description="Show whether a controller drives the workdir and each run's progress.")
    status.add_argument("workdir", type=Path, help=workdir_help)
    status.add_argument("--format", choices=("table", "json"), default="table", help="progress as a table or JSON")
    stop = sub.add_parser("stop", help="stop a drill's controller and leave its jobs running",
                          description="Stop the controller driving the workdir; its jobs keep running and the next "
                                      "`faultdrill drill SPEC` adopts them.")
    stop.add_argument("workdir", type=Path, help=workdir_help)
    cancel = sub.add_parser("cancel", help="cancel a drill: its controller stopped, its jobs cancelled",
                            description="Stop the controller (if one runs), cancel every job of the drill's "
                                        "unfinished runs and record them as cancelled; the drill is then finished.")
    cancel.add_argument("workdir", type=Path, help=workdir_help)
    report = sub.add_parser("report", help="print the report of a campaign's workdir",
                            description="Print the report of a campaign's workdir (its ledger).")
    report.add_argument("workdir", type=Path, help=workdir_help)
    report.add_argument("--format", choices=("table", "json"), default="table", help="report as tables or one JSON document")
    report.add_argument("--html", type=Path, metavar="OUT_DIR",
                        help="also write the report as a page with plots: OUT_DIR/index.html and its PNGs")
    _scope_arguments(report)
    doctor = sub.add_parser("doctor", help="check a site before the first drill: scheduler, nodes, clocks, files",
                            description="Check what a drill will meet here: the scheduler's commands and release, "
                                        "accounting and limits, a test job on the nodes (their Python and framework, "
                                        "their clocks against this node's, how late this node sees their files), the "
                                        "workdir's filesystem, and which fault kinds can act as you. With SPEC, its "
                                        "backend, workdir, partition, nodes and framework; exit code 1 if a check fails.")
    doctor.add_argument("spec", type=Path, nargs="?", help=spec_help)
    doctor.add_argument("--backend", choices=("local", "slurm", "pbs"), help="without a spec (default: slurm)")
    doctor.add_argument("--workdir", type=Path, help="without a spec: where the test job writes (shared with the nodes; "
                                                     "default ./.faultdrill-doctor)")
    doctor.add_argument("--nodes", type=int, help="nodes for the test job (default: the spec's, else 1)")
    doctor.add_argument("--partition", help="the test job's partition (default: the spec's, else the site's)")
    doctor.add_argument("--framework", help="the framework the nodes must import (default: the spec's)")
    doctor.add_argument("--format", choices=("table", "json"), default="table", help="a table or one JSON document")
    advise = sub.add_parser("advise", help="the Young and Daly checkpoint intervals for a drill's measured cost",
                            description="Young's and Daly's optimal checkpoint intervals (seconds and steps) and the "
                                        "goodput each predicts, from a drill's measured checkpoint cost, time to "
                                        "recover and step time (WORKDIR), or from --cost; the MTBF is yours to give.")
    advise.add_argument("workdir", type=Path, nargs="?", help="a drill's workdir (its ledger gives cost, restart, step)")
    advise.add_argument("--mtbf", type=float, required=True, metavar="S", help="mean time between failures, seconds")
    advise.add_argument("--cost", type=float, metavar="S", help="what one checkpoint holds training up, seconds")
    advise.add_argument("--restart", type=float, metavar="S", help="time from a failure to training again, seconds")
    advise.add_argument("--step", type=float, metavar="S", help="one training step, seconds (to say intervals in steps)")
    advise.add_argument("--every-steps", type=int, metavar="N", help="the interval in use, to compare (needs --step)")
    advise.add_argument("--format", choices=("table", "json"), default="table", help="a table or one JSON document")
    project_command.add_parser(sub)
    return parser


def _project(args: argparse.Namespace) -> int:
    if args.replay:
        project_command.replay_conflicts(args)
        return project_command.print_replays(args.workdir, args.format)
    projection = project_command.run(args)
    project_command.print_projection(projection, args.format)
    if args.html is not None:
        from orchestrator.project.page import write_projection_page

        page = write_projection_page(projection, args.html)
        print(f"faultdrill: the projection's page: {page}", file=sys.stderr)
    return 0


def _advise(args: argparse.Namespace) -> int:
    from orchestrator.report.advise import AdviceInputs, advice_document, inputs_from_workdir
    from orchestrator.report.tables import advice_table

    if (args.workdir is None) == (args.cost is None):
        raise AdviceError("give a drill's WORKDIR (its measured checkpoint cost) or --cost SECONDS, one of the two")
    if args.workdir is not None:
        inputs = inputs_from_workdir(args.workdir, args.mtbf, args.restart)
        if args.step is not None or args.every_steps is not None:
            inputs = replace(inputs, step_s=args.step or inputs.step_s, every_steps=args.every_steps or inputs.every_steps)
    else:
        inputs = AdviceInputs(checkpoint_s=args.cost, mtbf_s=args.mtbf, restart_s=args.restart or 0.0,
                              step_s=args.step, every_steps=args.every_steps)
    document = advice_document(inputs)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        report_console().print(advice_table(document))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from orchestrator.doctor import Interrupted, Site, diagnose
    from orchestrator.doctor.nodes import DISK_FULL_DEFAULT_MB
    from orchestrator.report.tables import doctor_table

    if args.spec is not None:
        campaign = load_campaign(args.spec)
        resources = campaign.resources
        site = Site(args.backend or campaign.backend, campaign.workdir, args.nodes or resources.nodes,
                    args.partition or resources.partition, args.framework or campaign.workload.framework,
                    campaign.parallel_runs or 1,  # unsaid: Slurm's and PBS's default (the limits it is checked against)
                    tuple(resources.extra_directives), campaign.checkpoint.every_runs_directory,
                    resources.container.image if resources.container is not None else None, campaign.ledger_dir,
                    max((float(getattr(fault, "max_fill_mb", 0.0)) for fault in campaign.faults
                         if fault.kind == "disk-full"), default=DISK_FULL_DEFAULT_MB))
    else:
        site = Site(args.backend or "slurm", (args.workdir or Path(".faultdrill-doctor")).resolve(), args.nodes or 1,
                    args.partition, args.framework)
    if site.nodes < 1:
        raise SpecError(f"--nodes {site.nodes}: the test job needs at least one node")
    try:
        document = diagnose(site).document()
    except Interrupted as stop:
        print(f"faultdrill: doctor stopped by {stop}: its test job cancelled, its files removed", file=sys.stderr)
        return 128 + stop.signum
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        report_console().print(doctor_table(document))
    return 1 if document["summary"]["fail"] else 0


def _validate(campaign: Campaign) -> int:
    from orchestrator.control.controller import plan_drill

    for run, faults in plan_drill(campaign):
        spare = run.campaign.resources.spare_nodes
        print(f"{run.run_id}: {run.campaign.workload.framework}, {run.ranks} ranks on "
              f"{run.campaign.resources.nodes} node(s){f' + {spare} spare' if spare else ''}, {len(faults)} fault(s), "
              f"restart {run.campaign.restart.strategy}")
        if run.torchrun:
            print(f"  launcher torchrun: one per node, its workers ({run.campaign.resources.tasks_per_node} per node) are "
                  "the ranks (a rank fault targets a worker; kill-rank process: launcher targets torchrun)")
    return 0


def _plan(campaign: Campaign) -> int:
    from orchestrator.control.controller import plan_drill

    for run, faults in plan_drill(campaign):
        print(f"{run.run_id}: {len(faults)} planned fault(s)")
        for fault in faults:
            when = (f"at step {fault.at_step}" if fault.at_step is not None
                    else f"{fault.delay_s:.3f} s after {fault.anchor}")
            extra = {k: v for k, v in fault.options.items() if k not in ("signal",) and v is not None}
            print(f"  {fault.index}: {fault.kind} -> {fault.target}, {when}" + (f" {extra}" if extra else ""))
    return 0


def _render(campaign: Campaign) -> int:
    for run in expand_runs(campaign):
        text, where = _dry_run(run)
        print(f"# ---- {run.run_id} ({campaign.backend} backend, {where})")
        for line in command_lines(run):
            print(f"# {line}")
        print(text)
    return 0


def command_lines(run: RunConfig) -> list[str]:
    """The user's command as each rank runs it (its first attempt; placeholders filled, ``python``
    the interpreter it will be), where, and what a restart adds; none for a built-in workload."""
    import shlex

    command = run.command
    if command is None:
        return []
    lines = ["each rank runs (under Faultdrill's supervisor, attempt 0):",
             f"  {shlex.join([*command.torchrun, *command.argv])}"]
    lines.append(f"  in {command.cwd or 'the directory the rank starts in'}")
    if command.resume_args:
        lines.append(f"  a restart adds: {shlex.join(command.resume_args)}")
    lines.append(f"  python: {run.campaign.workload.python or sys.executable}")
    return lines


def _dry_run(run: RunConfig) -> tuple[str, str]:
    if run.campaign.backend == "slurm":
        script = render_slurm(run, attempt=0, drill_id=DRY_RUN_DRILL_ID)
        return script.text, f"submitted with sbatch from {script.submit_dir}"
    if run.campaign.backend == "pbs":
        script = render_pbs(run, attempt=0, drill_id=DRY_RUN_DRILL_ID)
        return script.text, f"submitted with qsub from {script.submit_dir}"
    from orchestrator.backends.local.backend import describe_local

    return describe_local(run, 0, DRY_RUN_DRILL_ID), "run on this machine"


def _drill(campaign: Campaign, output_format: str, html: bool = True, scope: str = "drill",
           junit: Path | None = None) -> int:
    from orchestrator.control.controller import plan_drill
    from orchestrator.control.detach import ControllerLock, record_exit
    from orchestrator.control.workdir import prepare_workdir

    plan = plan_drill(campaign)  # every spec error before the workdir is touched
    archived = prepare_workdir(campaign)
    if archived is not None:
        print(f"faultdrill: the finished drill in {campaign.workdir} was moved to {archived}", file=sys.stderr)
    with ControllerLock(campaign.workdir):
        code, how = _drive(campaign, plan)
        record_exit(campaign.workdir, code, how)
    if code != 0:
        return code
    return _report(campaign.workdir, output_format, exit_on_failure=True,
                   html=campaign.workdir / REPORT_DIR if html else None, scope=scope, junit=junit)


def _drive(campaign: Campaign, plan: list[tuple[RunConfig, list[PlannedFault]]]) -> tuple[int, str]:
    """The controller to the end (or until SIGTERM, ``faultdrill stop``, or SIGHUP, a session that
    hung up: both stop it at its next round, never in the middle of a side effect); (exit code, how
    it ended)."""
    from orchestrator.control.controller import Controller
    from orchestrator.control.progress import DrillProgress
    from orchestrator.observe.scheduler_poll import SchedulerUnavailable

    controller = Controller(campaign, plan=plan)
    progress = DrillProgress(campaign.workdir)
    stops = (signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, lambda *_: controller.stop_requested.set()) for signum in stops}
    try:
        with progress:
            finished = controller.run(observer=progress)
    except SchedulerUnavailable as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return EXIT_SCHEDULER, "the scheduler stopped answering"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        progress.close()  # the last word of every run
        controller.close()
    if not finished:
        print(f"faultdrill: stopped; the drill's jobs keep running. `faultdrill drill SPEC` picks them up, "
              f"`faultdrill cancel {campaign.workdir}` cancels them", file=sys.stderr)
        return EXIT_STOPPED, "stopped (faultdrill stop)"
    return 0, "finished"


def _detach(campaign: Campaign, spec: Path, output_format: str, verbose: bool, html: bool = True,
            scope: str = "drill", junit: Path | None = None) -> int:
    from orchestrator.control.controller import plan_drill
    from orchestrator.control.detach import LOG_NAME, start_detached
    from orchestrator.control.workdir import claim_workdir

    plan_drill(campaign)  # every spec error here, before anything starts
    claim_workdir(campaign)  # the user's, before its lock file is opened; its log is written before the controller starts
    controller = live_controller(campaign.workdir)
    if controller is not None:
        raise ControllerBusy(f"a controller ({controller.where()}) already drives {campaign.workdir}; "
                             f"`faultdrill status {campaign.workdir}` shows it")
    argv = [*(["-v"] if verbose else []), "drill", str(spec.resolve()), "--format", output_format,
            *([] if html else ["--no-html"]), *([f"--{scope}"] if scope != "drill" else []),
            *(["--junit", str(junit.resolve())] if junit is not None else [])]
    identity = start_detached(argv, campaign.workdir)
    workdir = campaign.workdir
    print(f"faultdrill: drill {campaign.name} runs in the background (pid {identity.pid}); its log: "
          f"{workdir / LOG_NAME}\n  faultdrill status {workdir}   # progress\n  faultdrill stop {workdir}     "
          f"# stop the controller, leave the jobs\n  faultdrill cancel {workdir}   # cancel the drill")
    return 0


def _status(workdir: Path, output_format: str) -> int:
    from orchestrator.control.detach import read_exit
    from orchestrator.control.progress import progress_table, read_progress
    from orchestrator.control.workdir import check_workdir

    if not has_ledger(workdir):
        raise ReportError(f"{workdir}: no ledger.sqlite here; is this a campaign workdir?")
    workdir = check_workdir(workdir)  # its lock file is opened, its progress read
    identity = live_controller(workdir)
    ended = read_exit(workdir) if identity is None else None
    progress = read_progress(workdir)
    controller: dict[str, Any] = ({"running": True, "pid": identity.pid, "host": identity.host_name,
                                   "started": identity.started} if identity else
                                  {"running": False, "last_exit": asdict(ended) if ended else None})
    if output_format == "json":
        print(json.dumps({"workdir": str(workdir), "controller": controller,
                          "updated": progress[0] if progress else None,
                          "runs": [asdict(row) for row in progress[1]] if progress else []}, indent=2))
        return 0
    if identity is not None:
        print(f"controller: running, {identity.where()}, since {time.ctime(identity.started)}")
    elif ended is not None:
        print(f"controller: not running; the last one ended {time.ctime(ended.ended)}: {ended.how} "
              f"(exit code {ended.code})")
    else:
        print("controller: not running (the last one was killed or never started here); "
              "`faultdrill drill SPEC` resumes the drill")
    if progress is None:
        print("no progress recorded yet")
        return 0
    updated, rows = progress
    report_console().print(progress_table(rows, title=f"as of {time.ctime(updated)} "
                                                               f"({time.time() - updated:.0f} s ago)"))
    return 0


def _stop(workdir: Path) -> int:
    from orchestrator.control.detach import NoController, stop_controller
    from orchestrator.control.workdir import check_workdir

    workdir = check_workdir(workdir)  # the pid it signals is read from a file there
    try:
        identity = stop_controller(workdir)
    except NoController as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return EXIT_NO_CONTROLLER
    print(f"faultdrill: the controller (pid {identity.pid}) stopped; the drill's jobs keep running")
    return 0


def _cancel(workdir: Path) -> int:
    from orchestrator.control.controller import Controller
    from orchestrator.control.detach import ControllerLock, NoController, stop_controller
    from orchestrator.control.workdir import check_workdir, claim_workdir
    from orchestrator.record.ledger import LEDGER_NAME, Ledger

    if not has_ledger(workdir):
        raise ReportError(f"{workdir}: no ledger.sqlite here; is this a campaign workdir?")
    workdir = check_workdir(workdir)  # the pid it signals, the spec it drives and the actions it owes are read there
    try:
        identity = stop_controller(workdir)
        print(f"faultdrill: the controller (pid {identity.pid}) stopped")
    except NoController:
        pass
    ledger = Ledger.in_workdir(workdir)
    try:
        spec, finished = ledger.meta("spec"), ledger.meta("finished")
    finally:
        ledger.close()
    if finished is not None:
        print(f"faultdrill: the drill in {workdir} has finished; nothing to cancel")
        return 0
    campaign = parse_campaign(spec, base_dir=workdir, source=str(workdir / LEDGER_NAME))
    campaign = campaign.model_copy(update={"workdir": workdir.resolve()})
    claim_workdir(campaign)  # the spec's workdir_mode (0700 unless shared), and its umask for what cancel writes
    with ControllerLock(workdir):
        controller = Controller(campaign)
        try:
            outcome = controller.cancel()
        finally:
            controller.close()
    for run_id, job_ids in outcome.cancelled.items():
        if job_ids:
            print(f"{run_id}: cancelled job(s) {', '.join(job_ids)}")
    if outcome.alive:
        print(f"faultdrill: job(s) {', '.join(outcome.alive)} may still run: the scheduler refused to cancel them or "
              f"did not show them ended; their runs are not recorded cancelled. Run `faultdrill cancel {workdir}` "
              "again once it answers", file=sys.stderr)
        return EXIT_SCHEDULER
    print(f"faultdrill: drill cancelled; `faultdrill report {workdir}` shows it")
    return 0


def _report(workdir: Path, output_format: str, exit_on_failure: bool = False, html: Path | None = None,
            scope: str = "drill", junit: Path | None = None) -> int:
    """Write the report's page to ``html`` (a drill: to WORKDIR/report), then print the report,
    its last line saying where the page is."""
    from orchestrator.report.html import write_html_report  # matplotlib: loaded only for a page

    report = build_report(workdir)
    page = write_html_report(workdir, html, report) if html is not None else None
    if output_format == "json":
        print(json.dumps(report, indent=2, sort_keys=False))
        if page is not None:
            print(f"faultdrill: the report page: {page}", file=sys.stderr)
    else:
        print_report(report, page=page, scope=scope)
    if junit is not None:
        from orchestrator.report.junit import write_junit

        print(f"faultdrill: the objectives as JUnit XML: {write_junit(report, junit)}", file=sys.stderr)
    if exit_on_failure and any(run["status"] != "completed" for run in report["runs"]):
        return 1
    if exit_on_failure and not report["verdict"]["believed"]:
        return EXIT_INEFFECTIVE
    if exit_on_failure and report["verdict"]["slo_missed"]:
        return EXIT_SLO_MISSED
    return 0


def workdir_of(path: Path) -> Path:
    """A command's WORKDIR as given, or the workdir a spec file names (``report quick.yaml``)."""
    if path.is_file() and path.suffix in (".yaml", ".yml", ".json"):
        return load_campaign(path).workdir
    return path


def _dispatch(args: argparse.Namespace) -> int:
    if getattr(args, "workdir", None) is not None and args.command != "doctor":
        args.workdir = workdir_of(args.workdir)
    if args.command == "advise":
        return _advise(args)
    if args.command == "project":
        return _project(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "report":
        return _report(args.workdir, args.format, html=args.html, scope=args.scope, junit=args.junit)
    if args.command == "status":
        return _status(args.workdir, args.format)
    if args.command == "stop":
        return _stop(args.workdir)
    if args.command == "cancel":
        return _cancel(args.workdir)
    campaign = load_campaign(args.spec)
    if args.command == "validate":
        return _validate(campaign)
    if args.command == "render":
        return _render(campaign)
    if args.command == "plan" or args.dry_run:
        return _plan(campaign)
    if args.detach:
        return _detach(campaign, args.spec, args.format, args.verbose, html=not args.no_html, scope=args.scope,
                       junit=args.junit)
    return _drill(campaign, args.format, html=not args.no_html, scope=args.scope, junit=args.junit)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        code = _dispatch(args)
        sys.stdout.flush()
        return code
    except (SpecError, TemplateError, ReportError, ControllerBusy, AdviceError, LedgerBusy, LedgerElsewhere,
            project_command.ProjectError) as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return EXIT_SPEC
    except BrokenPipeError:
        # The reader (`| head`) is gone: say nothing more, and keep Python from complaining while
        # it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
