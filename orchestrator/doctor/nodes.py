"""What the test job found on the nodes, as checks: the Python and the framework there, each node's
clock against the login node's, how late the login node saw their files, and which fault kinds
can act here as this user."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from injectors.kinds import REGISTRY, get_kind
from injectors.kinds.disk_full import fill_problem
from orchestrator.commands import current_user
from orchestrator.doctor.checks import Check, failed, passed, warned
from orchestrator.doctor.marks import CheckpointMarks
from orchestrator.doctor.probe_job import NodeReport
from orchestrator.faults.job_control import NOT_OWN_CLUSTER, on_own_cluster

# A node's clock this far from the login node's (beyond the reading's own uncertainty) shifts the
# recovery phases measured across nodes by as much.
CLOCK_WARN_S = 0.05
VISIBLE_WARN_S = 1.0  # a file the login node sees this late makes every cross-node wait that long
NODE_KINDS = ("node-crash", "network-partition")
DISK_FULL_DEFAULT_MB = 1024.0  # disk-full's default max_fill_mb
NO_NODE = "no node of the test job answered"
SEE_PYTHON = "see nodes: python (a node that wrote no facts)"


def node_checks(reports: list[NodeReport], framework: str | None) -> list[Check]:
    checks = [_python(reports)]
    if framework:
        checks.append(_framework(reports, framework))
    return [*checks, _clocks(reports), _visibility(reports)]


def _python(reports: list[NodeReport]) -> Check:
    fix = ("the compute nodes need the login node's Python at the same path, with this checkout importable (a "
           "shared filesystem), as the drill's jobs run it")
    if not reports:
        return failed("nodes: python", NO_NODE, fix)
    broken = [f"{report.node}: {report.error}" for report in reports if report.facts is None]
    if broken:
        return failed("nodes: python", "; ".join(broken), fix)
    pythons = {f"{report.facts['python']} {report.facts['python_version']}" for report in reports if report.facts}
    return passed("nodes: python", f"{len(reports)} node(s): {', '.join(sorted(pythons))}")


def _framework(reports: list[NodeReport], framework: str) -> Check:
    errors = [f"{report.node}: {report.facts['framework_error']}" for report in reports
              if report.facts and "framework_error" in report.facts]
    if errors:
        return failed("nodes: framework", f"{framework} does not import: {'; '.join(errors)}",
                      f"install {framework} in the Python the nodes run")
    unknown = _unanswered(reports)
    if not reports or unknown:
        return warned("nodes: framework", f"not known for {unknown}" if unknown else f"not known: {NO_NODE}",
                      SEE_PYTHON)
    versions = {str(report.facts.get("framework_version")) for report in reports if report.facts}
    return passed("nodes: framework", f"{framework} {', '.join(sorted(versions))} imports on every node")


def _clocks(reports: list[NodeReport]) -> Check:
    read = [report for report in reports if report.clock is not None]
    unread = [f"{report.node}: {report.error or 'not read'}" for report in reports if report.clock is None]
    said = ", ".join(f"{r.node} {r.clock.offset_s:+.4f} s (+-{r.clock.uncertainty_s:.4f})" for r in read if r.clock)
    off = [r.node for r in read if r.clock and abs(r.clock.offset_s) - r.clock.uncertainty_s > CLOCK_WARN_S]
    if not reports:
        return warned("clocks", f"not read: {NO_NODE}", SEE_PYTHON)
    if unread:
        return warned("clocks", "; ".join(unread) + (f"; read: {said}" if said else ""),
                      "the clock conversation runs as a step of the test job (srun --overlap; on PBS, ssh or a "
                      f"step under the wrappers): check it works there; a node without facts: {SEE_PYTHON}")
    if off:
        return warned("clocks", f"off the login node's by more than {CLOCK_WARN_S:g} s: {', '.join(off)} ({said})",
                      "the drill reads each node's clock while a job runs and moves its stamps onto the login clock "
                      "(the report shows each phase's bounds); clocks that drift apart within a job are not followed: "
                      "have the nodes' clocks synchronized (NTP, chrony)")
    return passed("clocks", f"against the login node's: {said}")


def _visibility(reports: list[NodeReport]) -> Check:
    late = {r.node: r.visible_after_s for r in reports if r.visible_after_s is not None}
    said = ", ".join(f"{node} {seconds:.2f} s" for node, seconds in late.items())
    if not reports:
        return warned("shared filesystem", f"not measured: {NO_NODE}", SEE_PYTHON)
    if any(seconds > VISIBLE_WARN_S for seconds in late.values()):
        return warned("shared filesystem", f"the login node saw the nodes' files late: {said}",
                      "the drill waits for what it reads, but each cross-node step (a fault's arming, a "
                      "checkpoint's receipt) takes that much longer; a mount with shorter attribute caching "
                      "(NFS: actimeo) helps")
    if unknown := _unanswered(reports):
        return warned("shared filesystem", f"not measured for {unknown}" + (f"; seen after {said}" if said else ""),
                      SEE_PYTHON)
    if len(late) == len(reports):
        return passed("shared filesystem", f"the nodes' files seen here after {said}")
    if any(report.seen_at is not None for report in reports):
        return warned("shared filesystem", "not measured: no node's clock could be read (see clocks)",
                      "the delay is measured on the login node's clock, from each node's offset")
    return passed("shared filesystem", "not measured (one host: no filesystem between nodes)")


def _unanswered(reports: list[NodeReport]) -> str:
    """The nodes no facts came from, said (empty: none)."""
    return ", ".join(f"{report.node} (no facts)" for report in reports if report.facts is None)


def checkpoint_checks(marks: CheckpointMarks, reports: list[NodeReport]) -> list[Check]:
    """Whether every node sees the checkpoint directory as the login node does: the login node's
    file there, a file of the node's own written there and seen here (while ``marks`` are there)."""
    problems = [*marks.problems, *([NO_NODE] if not reports else [])]
    for report in reports:
        if report.facts is None:
            problems.append(f"{report.node} never answered: whether it sees the directory is not known")
            continue
        said = report.facts.get("checkpoints") or {}
        if not said.get("sees_login_file"):
            problems.append(f"{report.node} does not see the login node's file there")
        if not said.get("wrote"):
            problems.append(f"{report.node} cannot write there ({said.get('error', '?')})")
        elif not marks.sees(_node_of(report)):
            problems.append(f"the login node does not see {report.node}'s file there")
    if problems:
        return [failed("checkpoints: nodes", f"{marks.directory}: {'; '.join(problems)}",
                       "checkpoint.directory must be one filesystem that the login node and every compute node "
                       "mount at the same path, where you may write (a node-local /tmp or scratch is not)")]
    return [passed("checkpoints: nodes", f"{len(reports)} node(s) see {marks.directory} and write there, as the "
                   "login node does")]


def cleanup_check(marks: CheckpointMarks) -> list[Check]:
    """What could not be removed after the test job, or may be left where only a node sees it
    (nothing to say when all was removed)."""
    checks = []
    if marks.left_behind:
        checks.append(failed("checkpoints: cleanup", f"{marks.directory}: the doctor's files could not be removed: "
                             f"{'; '.join(marks.left_behind)}", "remove them by hand"))
    if unconfirmed := marks.unconfirmed():
        names = ", ".join(f"{node}: {marks.node_file(node).name}" for node in unconfirmed)
        checks.append(warned("checkpoints: cleanup", f"{marks.directory}: the test job was ended before its last step "
                             f"removed each node's file, which this node never saw: it may be left there ({names})",
                             "remove it on that node by hand"))
    return checks


def _node_of(report: NodeReport) -> str:
    """The name the node wrote its file under (its facts'), else the scheduler's name for it."""
    return str((report.facts or {}).get("node") or report.node)


def _oom_rank_check(facts: list[dict[str, Any]]) -> Check:
    """oom-rank makes the rank outgrow the job's memory limit where the scheduler's cgroup sets one
    (any user), else caps it with a cgroup of its own (root, cgroup v1)."""
    limits = [float(found["job_memory_limit_mb"]) for found in facts if found.get("job_memory_limit_mb")]
    if facts and len(limits) == len(facts):
        return passed("fault kinds: oom-rank", f"the scheduler limits the test job's memory ({min(limits):.0f} MB): "
                      "oom-rank makes the rank outgrow its job's limit (limit: auto or job), as any user")
    capped = [f"{found['node']}: {found['memory_cap']}" for found in facts if found.get("memory_cap")]
    if capped or not facts:
        return warned("fault kinds: oom-rank", f"cannot cap a rank's memory here ({'; '.join(capped) or 'no node'}), "
                      "and the scheduler sets the job no memory limit",
                      "confine the jobs' memory (Slurm: task/cgroup, ConstrainRAMSpace, --mem), drill as root on a "
                      "node with a cgroup v1 memory controller, or leave oom-rank out")
    return passed("fault kinds: oom-rank", "a rank's memory can be capped (root, cgroup v1 memory)")


def _disk_full_check(checkpoints: Path, max_fill_mb: float) -> Check:
    """disk-full fills the filesystem of the runs' checkpoint directory, and only a small one (at
    most ``max_fill_mb``: the spec's disk-full faults', else the kind's default)."""
    problem = fill_problem(checkpoints, max_fill_mb)
    if problem is not None:
        return warned("fault kinds: disk-full", problem,
                      "leave disk-full out, or give the spec a checkpoint.directory on a small filesystem mounted "
                      "for it")
    return passed("fault kinds: disk-full", f"{checkpoints}'s filesystem is small enough for disk-full to fill "
                  f"(at most {max_fill_mb:g} MB, max_fill_mb)")


def kind_checks(backend: str, reports: list[NodeReport], checkpoints: Path,
                max_fill_mb: float = DISK_FULL_DEFAULT_MB) -> list[Check]:
    """Which fault kinds can act here as this user, and why not. ``checkpoints``: where the runs'
    checkpoints go (the spec's checkpoint.directory, else the workdir), which disk-full fills."""
    checks = []
    checks.append(_oom_rank_check([report.facts for report in reports if report.facts]))
    node_kinds = [name for name in NODE_KINDS if backend in get_kind(name).works_on]
    if node_kinds and not on_own_cluster():
        checks.append(warned(f"fault kinds: {', '.join(node_kinds)}", f"this is not the project's cluster: "
                             f"{NOT_OWN_CLUSTER}", "give each node fault the site's own commands, or leave them out"))
    elif node_kinds and os.geteuid() != 0:
        checks.append(warned(f"fault kinds: {', '.join(node_kinds)}", f"the project's cluster, but you are "
                             f"{current_user()}, not root: scripts/cluster acts as root only",
                             "give each node fault the site's own commands, drill as root, or leave them out"))
    elif node_kinds:
        checks.append(passed(f"fault kinds: {', '.join(node_kinds)}", "the project's cluster: scripts/cluster acts"))
    checks.append(_disk_full_check(checkpoints, max_fill_mb))
    others = sorted(set(REGISTRY) - {"oom-rank", "disk-full", *NODE_KINDS}
                    - {name for name in REGISTRY if backend not in get_kind(name).works_on})
    checks.append(passed("fault kinds: the rest", f"{', '.join(others)} act as your own user"))
    return checks
