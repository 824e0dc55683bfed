"""The fault catalogue: one module per kind, one line here (as experiments/workloads does for
frameworks). A kind is named in a spec's ``faults: [{kind: ...}]``."""

from __future__ import annotations

import functools
import importlib

from injectors.kinds.base import FaultKind, FaultOptions

REGISTRY: dict[str, str] = {
    "kill-rank": "injectors.kinds.kill_rank:KillRank",
    "hang-rank": "injectors.kinds.hang_rank:HangRank",
    "stall-rank": "injectors.kinds.stall_rank:StallRank",
    "corrupt-checkpoint": "injectors.kinds.corrupt_checkpoint:CorruptCheckpoint",
    "node-crash": "injectors.kinds.node_crash:NodeCrash",
    "network-partition": "injectors.kinds.network_partition:NetworkPartition",
    "preempt": "injectors.kinds.preempt:Preempt",
    "disk-full": "injectors.kinds.disk_full:DiskFull",
    "timeout": "injectors.kinds.timeout:Timeout",
    "oom-rank": "injectors.kinds.oom_rank:OomRank",
    "rank-error": "injectors.kinds.rank_error:RankError",
}


class UnknownFaultKind(ValueError):
    pass


@functools.cache
def get_kind(name: str) -> FaultKind:
    target = REGISTRY.get(name)
    if target is None:
        raise UnknownFaultKind(f"unknown fault kind {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    module_name, _, class_name = target.partition(":")
    kind: FaultKind = getattr(importlib.import_module(module_name), class_name)()
    return kind


def option_models() -> dict[str, type[FaultOptions]]:
    """Each kind's options model, by kind name: the spec's ``faults`` entries are one of these."""
    return {name: get_kind(name).options for name in REGISTRY}
