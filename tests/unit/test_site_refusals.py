"""Issue 22, item 4: a fault kind that cannot act here says so up front (validate, plan, drill),
never mid-drill. A node fault with no site command acts through scripts/cluster, which only the
project's own cluster has; the refusal's example is one the spec accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.slurm import version as slurm_version
from orchestrator.campaign.spec import SpecError, parse_campaign
from orchestrator.control.controller import plan_drill
from orchestrator.faults import job_control


def _campaign(tmp_path: Path, fault: dict[str, Any]) -> Any:
    return parse_campaign({
        "name": "site", "backend": "slurm", "workdir": str(tmp_path / "work"),
        "workload": {"framework": "torch", "params": 2000, "steps": 50},
        "resources": {"nodes": 2, "tasks_per_node": 1},
        "faults": [fault],
    }, base_dir=tmp_path)


@pytest.fixture
def not_our_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_control, "_cluster_facts", lambda: {})  # no scripts/cluster here
    monkeypatch.setattr(slurm_version, "site_version", lambda: (22, 5))  # a Slurm with srun --overlap


def test_a_node_fault_without_a_site_command_is_refused_before_anything_is_made(
        tmp_path: Path, not_our_cluster: None) -> None:
    with pytest.raises(SpecError, match=r"faults\[0\] \(node-crash\): this is not the project's own cluster"):
        plan_drill(_campaign(tmp_path, {"kind": "node-crash", "after": {"at_step": 20}}))
    assert not (tmp_path / "work").exists()


def test_the_refusals_example_is_a_command_the_spec_accepts(tmp_path: Path, not_our_cluster: None) -> None:
    """The hint said `{crash: ..., restore: ...}`, a spec error for whoever followed it."""
    example = {"act": ["ipmitool", "power", "off", "{node}"], "mend": ["ipmitool", "power", "on", "{node}"]}
    assert "{act: [" in job_control.NOT_OWN_CLUSTER and "mend: [" in job_control.NOT_OWN_CLUSTER
    plan = plan_drill(_campaign(tmp_path, {"kind": "node-crash", "after": {"at_step": 20}, "command": example}))
    [(_, [fault])] = plan
    assert fault.kind == "node-crash"
