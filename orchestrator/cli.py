"""``faultdrill``: render (dry-run), drill, report, validate."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from orchestrator.render import TemplateError, render_slurm
from orchestrator.report import ReportError, build_report
from orchestrator.runs import expand_runs
from orchestrator.spec import Campaign, SpecError, load_campaign
from orchestrator.tables import print_report
from orchestrator.workdir import prepare_workdir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultdrill", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every decision of the controller")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="check a spec and list its runs; submits nothing")
    validate.add_argument("spec", type=Path)
    render = sub.add_parser("render", help="print the batch script of every run; submits nothing")
    render.add_argument("spec", type=Path)
    drill = sub.add_parser("drill", help="run a campaign to the end, then print its report")
    drill.add_argument("spec", type=Path)
    drill.add_argument("--format", choices=("table", "json"), default="table")
    report = sub.add_parser("report", help="print the report of a campaign's workdir")
    report.add_argument("workdir", type=Path)
    report.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def _validate(campaign: Campaign) -> int:
    for run in expand_runs(campaign):
        print(f"{run.run_id}: {run.campaign.workload.framework}, {run.ranks} ranks on "
              f"{run.campaign.resources.nodes} node(s), {len(run.campaign.faults)} fault(s)")
    return 0


def _render(campaign: Campaign) -> int:
    for run in expand_runs(campaign):
        script = render_slurm(run, attempt=0, drill_id="(dry-run)")
        print(f"# ---- {run.run_id} (submitted from {script.submit_dir})")
        print(script.text)
    return 0


def _drill(campaign: Campaign, output_format: str) -> int:
    from orchestrator.controller import Controller
    from orchestrator.progress import Progress

    archived = prepare_workdir(campaign)
    if archived is not None:
        print(f"faultdrill: the finished drill in {campaign.workdir} was moved to {archived}", file=sys.stderr)
    controller = Controller(campaign)
    try:
        with Progress() as progress:
            controller.run(observer=progress)
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "report":
            return _report(args.workdir, args.format)
        campaign = load_campaign(args.spec)
        if args.command == "validate":
            return _validate(campaign)
        if args.command == "render":
            return _render(campaign)
        return _drill(campaign, args.format)
    except (SpecError, TemplateError, ReportError) as error:
        print(f"faultdrill: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
