"""The report's answer, before any table: one line per run that met a fault (what hit it, how long
it took to recover and from what, the work lost, whether it ended as its twin), one per run that
failed, and a last line with the verdict and where the report page is. Errors are shortened to their
cause here and in the tables (``short_cause``); the whole text stays in ``--format json``, the
attempt's logs and the HTML page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")
CAUSE_LIMIT = 110  # characters of a shortened error, at most
# A collective's words for a lost peer, by the library that says them: what a table shows instead.
PEER_LOSS_WORDS = (
    (re.compile(r"Connection reset by peer", re.I), "gloo: connection reset by peer"),
    (re.compile(r"Connection closed by peer", re.I), "gloo: connection closed by peer"),
    (re.compile(r"Watchdog caught collective operation timeout", re.I), "NCCL: watchdog timeout"),
    (re.compile(r"NCCL communicator was aborted", re.I), "NCCL: communicator aborted"),
    (re.compile(r"ProcessGroupNCCL.*(?:remote process exited|peer)", re.I), "NCCL: a peer exited"),
)
_SOURCE_LOCATION = re.compile(r"\[/[^\]]*:\d+\]\s*")  # [/__w/pytorch/.../pair.cc:537]
_LOST_PEER = re.compile(r"(lost a peer): [A-Za-z_.]*(?:Error|Exception)?:? [^;]*")
_NOT_ASCII = re.compile(r"[^\x20-\x7e]+")


def short_cause(text: str | None, limit: int = CAUSE_LIMIT) -> str:
    """An error or a fault's detail, shortened to its cause: a collective's lost-peer error named by
    its library's words, no source locations or symbols, one sentence per error, at most ``limit``
    characters (cut at a word, marked with "...")."""
    if not text:
        return ""
    said = _SOURCE_LOCATION.sub("", text)
    words = next((word for pattern, word in PEER_LOSS_WORDS if pattern.search(said)), None)
    if words is not None:
        said = _LOST_PEER.sub(lambda found: f"{found.group(1)} ({words})", said)
    said = _NOT_ASCII.sub(" ", said)
    said = re.sub(r"(\w[\w ]*?: [^.;]*?[a-z)])\. [A-Z][^;]*", r"\1", said)  # an error's first sentence alone
    said = " ".join(said.split())
    if len(said) <= limit:
        return said
    cut = said[: limit - 4].rsplit(" ", 1)[0].rstrip(",;:")
    return f"{cut} ..."


TERMINAL_ROWS = 50  # lines (or a table's rows) a terminal shows; past it, the exceptions and a count of the rest


def answer_lines(report: dict[str, Any], page: Path | None = None) -> list[str]:
    """One line per run that met a fault or did not complete, then the verdict. A sweep with more
    such runs than a terminal shows (TERMINAL_ROWS): the runs that failed, differ from their twin or
    have findings, then one line for the rest (every run is in --format json and the HTML page)."""
    said = [(run, line) for run in report["runs"] if (line := _run_line(run)) is not None]
    if len(said) <= TERMINAL_ROWS:
        return [*(line for _, line in said), _verdict(report, page)]
    exceptions = [line for run, line in said if is_exception(run)]
    shown = exceptions[:TERMINAL_ROWS]
    rest = [run for run, _ in said if not is_exception(run)]
    return [*shown, *_more_lines(len(exceptions) - len(shown), rest), _verdict(report, page)]


def is_exception(run: dict[str, Any]) -> bool:
    """A run a long report lists by name: it did not complete, it differs from its twin (or its
    outputs to compare are missing), it resumed from an older step than its newest checkpoint or
    replayed steps, or its records have findings."""
    progress = run.get("progress") or {}
    return (run["status"] != "completed" or run.get("identical_to_baseline") is False
            or (run.get("outputs") or {}).get("verdict") in ("differs", "missing")
            or bool(progress.get("resume_mismatch") or progress.get("replayed")) or bool(run.get("findings")))


def _more_lines(unlisted_exceptions: int, rest: list[dict[str, Any]]) -> list[str]:
    lines = [f"... and {unlisted_exceptions} more such run(s) (--format json, the report page)"] if unlisted_exceptions else []
    if rest:
        ttrs = sorted(recovery["ttr_s"] for run in rest for recovery in run["recoveries"])
        recovered = (f", ttr median {ttrs[len(ttrs) // 2]:.2f} s, slowest {ttrs[-1]:.2f} s ({len(ttrs)} recoveries)"
                     if ttrs else "")
        lines.append(f"{len(rest)} more run(s) met a fault and completed (none of them failed, differs from its twin "
                     f"or has a finding){recovered}")
    return lines


def _run_line(run: dict[str, Any]) -> str | None:
    if run["is_baseline"] or (not run["faults"] and run["status"] == "completed"):
        return None
    inferred = set((run.get("progress") or {}).get("inferred", ()))
    hits = "; ".join(_fault_phrase(fault) for fault in run["faults"]) or "no fault"
    outcomes = [_recovery_phrase(recovery, inferred) for recovery in run["recoveries"]]
    if run["status"] != "completed":
        why = short_cause(run.get("ended_because"), 80)
        outcomes.append(f"{run['status']}: {why}" if why else run["status"])
    elif not outcomes:
        outcomes.append("completed without a restart")
    ending = [] if run["status"] != "completed" else [_identity_phrase(run)]
    findings = [f"{finding['verdict'].upper()}: {short_cause(finding['what'].split(': ', 1)[-1], 90)}"
                for finding in run.get("findings", [])]
    return f"{run['run_id']}  {hits} -> " + ", ".join([*outcomes, *ending, *findings])


def _fault_phrase(fault: dict[str, Any]) -> str:
    target = str(fault["target"]).split("@", 1)[0]
    when = (f"at step {fault['met_step']}" if fault.get("met_step") is not None
            else f"at step {fault['planned_step']}" if fault.get("planned_step") is not None
            else f"after {fault['planned_delay_s']:.1f} s")
    phrase = f"{fault['kind']} {target} {when}"
    if fault["outcome"] != "injected":
        phrase += f" ({fault['outcome']}: {short_cause(fault.get('detail'), 60)})"
    return phrase


def _recovery_phrase(recovery: dict[str, Any], inferred: set[str]) -> str:
    mark = "~" if "lost_steps" in inferred else ""
    longest = max(PHASES, key=lambda phase: recovery[phase])
    ttr = _seconds(recovery, "ttr_s")
    lost = f"{mark}{int(recovery['lost_steps'])} steps ({recovery['lost_s']:.2f} s) lost"
    if recovery.get("state_source") == "peer":
        lost = f"state from a survivor, {lost}"
    return (f"{recovery.get('failure_class') or 'failed'}, recovered in {ttr} s "
            f"({longest.removesuffix('_s').replace('_', ' ')} {_seconds(recovery, longest)}), {lost}")


def _seconds(recovery: dict[str, Any], key: str) -> str:
    """A phase as the clocks allow it: at most its bound where shorter than its uncertainty."""
    bound = (recovery.get("phase_uncertainty_s") or {}).get(key)
    if key in recovery.get("below_uncertainty", ()) and bound is not None:
        return f"<={recovery[key] + bound:.2f}"
    value = float(recovery[key])
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _identity_phrase(run: dict[str, Any]) -> str:
    identical = run.get("identical_to_baseline")
    outputs = run.get("outputs") or {}
    if identical is True:
        return "identical to its twin"
    if identical is False:
        return "DIFFERS from its twin" + (f" (max {outputs['max_abs_diff']:.3g})" if outputs.get("max_abs_diff") else "")
    if outputs.get("verdict") == "missing":
        return "its outputs (workload.outputs) MISSING: not compared with its twin"
    if outputs.get("note"):
        return "not compared with its twin (workload.outputs)"
    return "no twin to compare"


def _verdict(report: dict[str, Any], page: Path | None) -> str:
    runs = [run for run in report["runs"] if not run["is_baseline"]]
    completed = sum(1 for run in runs if run["status"] == "completed")
    recovered = sum(len(run["recoveries"]) for run in runs)
    differs = sum(1 for run in runs if run.get("identical_to_baseline") is False)
    verdict = report.get("verdict") or {}
    said = [f"{completed} of {len(runs)} run(s) completed", f"{recovered} recovery(ies)"]
    if differs:
        said.append(f"{differs} differ(s) from its twin")
    findings = verdict.get("ineffective", 0) + verdict.get("suspicious", 0)
    if findings:
        said.append(f"{verdict['ineffective']} ineffective fault(s) and {verdict['suspicious']} suspicious record(s)"
                    + (" (allowed by the spec)" if verdict.get("allowed") else ": NOT TO BE BELIEVED as it stands"))
    if verdict.get("slo_met", 0) + verdict.get("slo_missed", 0):
        said.append(f"objectives (slo) {verdict['slo_met']} met, {verdict['slo_missed']} missed")
    # as the exit code says it (docs: 1, 6, 5); a run that differs from its twin is a finding of the
    # study, said above, not a failed drill (an objective `identical: true` makes it one)
    good = completed == len(runs) and (not findings or verdict.get("allowed")) and not verdict.get("slo_missed")
    where = f"; report page: {page}" if page is not None else ""
    return f"Verdict: {'ok' if good else 'FAILED'}: " + ", ".join(said) + where
