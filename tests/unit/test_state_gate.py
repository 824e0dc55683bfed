"""The gate around a step's local update (warm sets without rollback): held, no update starts; the
step it names is the state's; an update that fails part-way leaves a state that is no step's."""

from __future__ import annotations

import threading

import pytest

from experiments.runtime.state_gate import StateGate
from warm_scenario import within

pytestmark = pytest.mark.unit


def test_hold_waits_for_the_update_in_progress_and_no_update_starts_after_it() -> None:
    gate, state = StateGate(), {"step": 4}
    gate.resumed(4)
    entered, started_after_hold = threading.Event(), threading.Event()

    def train() -> None:
        with gate.updating(5):
            entered.set()
            # the hold has begun (it waits for this update), however slow the machine
            assert within(5.0, gate._holding.locked)
            state["step"] = 5
        # the next step's all-reduce: the hold, the only one waiting, takes the gate meanwhile
        assert within(5.0, lambda: gate.held)
        with gate.updating(6):  # blocks for good: the gate is held
            started_after_hold.set()

    threading.Thread(target=train, daemon=True).start()
    assert entered.wait(5)
    assert gate.hold() == 5 and state["step"] == 5, "the update of step 5 finished first"
    assert gate.hold() == 5, "a second hold (a request and a failed step) holds once"
    assert not started_after_hold.wait(0.3)


def test_an_update_that_failed_part_way_leaves_no_step_to_serve() -> None:
    """Review: the held step was 4 while the state was half of step 5's update."""
    gate = StateGate()
    gate.resumed(4)
    with pytest.raises(MemoryError):
        with gate.updating(5):
            raise MemoryError("the update failed half-way")
    assert gate.hold() == 0, "no step: never a source (the next set takes another's state or the checkpoint)"
