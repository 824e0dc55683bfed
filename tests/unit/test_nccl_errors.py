"""A survivor's NCCL error is a consequence, not a cause (real-sites issue, item 9): a rank that
died or hung makes every other rank's watchdog time out, or its NCCL call fail with ncclRemoteError.
Those errors were taken for causes: the failure got the survivor's class and its node was blamed.
Recorded errors (tests/recorded/nccl_rank_errors.txt), as users' logs show them."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.campaign.failure_classes import is_peer_loss

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "nccl_rank_errors.txt"


def _blocks() -> list[tuple[str, str]]:
    text = "\n".join(line for line in RECORDED.read_text().splitlines() if not line.startswith("#"))
    blocks = []
    for block in text.split("\n---\n"):
        kind, _, error = block.strip().partition("\n")
        blocks.append((kind.rstrip(":"), error))
    return blocks


@pytest.mark.parametrize(("kind", "error"), _blocks())
def test_a_survivors_nccl_error_is_a_peer_loss_and_a_ranks_own_is_not(kind: str, error: str) -> None:
    assert is_peer_loss(error) is (kind == "peer"), error
