"""``faultdrill``: submit sweeps, rehearse failures and measure what a failure costs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from importlib import metadata
from pathlib import Path

from orchestrator.render import TemplateError, render_pbs, render_slurm
from orchestrator.report import ReportError, build_report
from orchestrator.runs import RunConfig, expand_runs
from orchestrator.spec import Campaign, SpecError, load_campaign
from orchestrator.tables import print_report

EXIT_SPEC = 2  # the spec (or the workdir) cannot be used; nothing was submitted
EXIT_SCHEDULER = 3  # the scheduler stopped answering; the drill stopped, its jobs left as they are
EXIT_PIPE = 141  # the reader of our output went away (128 + SIGPIPE, as a shell reports it)
DRY_RUN_DRILL_ID = "(dry-run)"


def _version() -> str:
    try:
        return metadata.version("faultdrill")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultdrill", description=__doc__)
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
    drill.add_argument("--dry-run", action="store_true", help="print the fault plan (as `faultdrill plan`) and stop")
    report = sub.add_parser("report", help="print the report of a campaign's workdir",
                            description="Print the report of a campaign's workdir (its ledger).")
    report.add_argument("workdir", type=Path, help="the campaign's workdir (holds ledger.sqlite)")
    report.add_argument("--format", choices=("table", "json"), default="table", help="report as tables or one JSON document")
    return parser


def _validate(campaign: Campaign) -> int:
    from orchestrator.controller import plan_drill

    for run, faults in plan_drill(campaign):
        print(f"{run.run_id}: {run.campaign.workload.framework}, {run.ranks} ranks on "
              f"{run.campaign.resources.nodes} node(s), {len(faults)} fault(s)")
    return 0


def _plan(campaign: Campaign) -> int:
    from orchestrator.controller import plan_drill

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
        print(text)
    return 0


def _dry_run(run: RunConfig) -> tuple[str, str]:
    if run.campaign.backend == "slurm":
        script = render_slurm(run, attempt=0, drill_id=DRY_RUN_DRILL_ID)
        return script.text, f"submitted with sbatch from {script.submit_dir}"
    if run.campaign.backend == "pbs":
        script = render_pbs(run, attempt=0, drill_id=DRY_RUN_DRILL_ID)
        return script.text, f"submitted with qsub from {script.submit_dir}"
    from orchestrator.backends.local import describe_local

    return describe_local(run, 0, DRY_RUN_DRILL_ID), "run on this machine"


def _drill(campaign: Campaign, output_format: str) -> int:
    from orchestrator.controller import Controller, plan_drill
    from orchestrator.scheduler_poll import SchedulerUnavailable
    from orchestrator.progress import Progress
    from orchestrator.workdir import prepare_workdir

    plan = plan_drill(campaign)  # every spec error before the workdir is touched
    archived = prepare_workdir(campaign)
    if archived is not None:
        print(f"faultdrill: the finished drill in {campaign.workdir} was moved to {archived}", file=sys.stderr)
    controller = Controller(campaign, plan=plan)
    try:
        with Progress() as progress:
            controller.run(observer=progress)
    except SchedulerUnavailable as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return EXIT_SCHEDULER
    finally:
        controller.close()
    return _report(campaign.workdir, output_format, exit_on_failure=True)


def _report(workdir: Path, output_format: str, exit_on_failure: bool = False) -> int:
    report = build_report(workdir)
    if output_format == "json":
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        print_report(report)
    if exit_on_failure and any(run["status"] != "completed" for run in report["runs"]):
        return 1
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "report":
        return _report(args.workdir, args.format)
    campaign = load_campaign(args.spec)
    if args.command == "validate":
        return _validate(campaign)
    if args.command == "render":
        return _render(campaign)
    if args.command == "plan" or args.dry_run:
        return _plan(campaign)
    return _drill(campaign, args.format)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        code = _dispatch(args)
        sys.stdout.flush()
        return code
    except (SpecError, TemplateError, ReportError) as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return EXIT_SPEC
    except BrokenPipeError:
        # The reader (`| head`) is gone: say nothing more, and keep Python from complaining while
        # it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
