"""The warm coordinator over real loopback sockets, with its members scripted by the test: the
host around it (``Host``: events, fences, spares started), a coordinator serving on 127.0.0.1
(``start_coordinator``), a member that proved the job's secret (``warm_member``). Shared by
tests/unit/test_warm_coordinator.py and tests/unit/test_warm_message_loss.py."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

from experiments.warm.coordinator import Coordinator, CoordinatorGaveUp, Placement, Timing
from experiments.warm.member import WarmMember
from experiments.warm.protocol import new_secret
from experiments.warm.store_host import StoreHost

SECRET = new_secret()  # the job's warm channel secret, as the host makes one


class Host:
    """What the job around the coordinator records: events per attempt, fences, spares started."""

    def __init__(self) -> None:
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.fences: list[int] = []
        self.spawned: list[tuple[int, int]] = []
        self.placements: list[Placement] = []  # where each spare was to go
        self.order: list[str] = []  # fences and plans, as they came
        self.ended: list[list[int]] = []  # restart_all: the slots whose processes the host was told to end

    def event(self, attempt: int, event: dict[str, Any]) -> None:
        if event["event"] == "warm_plan":
            self.order.append(f"plan {attempt}")
        self.events.append((attempt, event))

    def fence(self, attempt: int) -> None:
        self.order.append(f"fence {attempt}")
        self.fences.append(attempt)

    def spawn(self, slot: int, attempt: int, where: Placement) -> None:
        self.spawned.append((slot, attempt))
        self.placements.append(where)

    def named(self, name: str) -> list[tuple[int, dict[str, Any]]]:
        return [(attempt, event) for attempt, event in self.events if event["event"] == name]


def start_coordinator(host: Host, world: int, spares: int, timing: Timing | None = None,
                      restart_all: bool = False, spawn: Callable[[int, int, Placement], None] | None = None,
                      stores: StoreHost | None = None) -> tuple[Coordinator, str, dict]:
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    coordinator = Coordinator(world_size=world, spares_wanted=spares, first_attempt=3, port_base=40000, secret=SECRET,
                              events=host.event, fence=host.fence, spawn=spawn or host.spawn,
                              exit_code=lambda slot: -9, timing=timing or Timing(report_s=5, spare_s=5, start_s=5),
                              restart_all=restart_all, end=host.ended.append, stores=stores)
    outcome: dict[str, Any] = {}

    def serve() -> None:
        try:
            outcome["verdict"] = coordinator.serve(listener)
        except CoordinatorGaveUp as error:
            outcome["gave_up"] = str(error)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return coordinator, address, outcome


MEMBER_WAIT_S = 20.0


def within(seconds: float, condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def warm_member(address: str, slot: int, node: str = "n1", connect_timeout_s: float = 5,
                state_port: int = 0) -> WarmMember:
    member = WarmMember(address, slot=slot, node=node, address="127.0.0.1", connect_timeout_s=connect_timeout_s,
                        secret=SECRET, state_port=state_port)
    member.line.connection.settimeout(MEMBER_WAIT_S)  # a plan that never comes fails the test, never hangs it
    return member
