"""The warm coordinator's message-loss harness (issue 21): every protocol message of a recovery
dropped, then delayed, and every member's process killed as each message passes; after each
variant the coordinator's promises are checked.

The base scenario, over real loopback sockets: world 2 and one warm spare (slots 0, 1, 2); the
ranks form generation 0; rank 1 dies after step 57 (its connection ends); rank 0 reports ``lost``;
the spare takes rank 1 with ``resume: peer`` from rank 0; both report ``formed``, then ``done``:
the verdict is ``completed``. Each member's connection passes through a ``Relay`` that sees every
line both ways. The base scenario passes N = 17 messages (BASE_MESSAGES); the variants: each
dropped (17), each delayed past the timing that watches it (17), each member killed as each
message passes while its process lives (43): 77 variants, run six at a time, in ~9 s on 2 cores.

Invariants, after every variant: the coordinator ends (verdict ``completed``, or CoordinatorGaveUp
naming what was missing: the exact outcome each variant is expected to have, GIVE_UPS); the fence
moves forward only, one attempt per generation, before that generation's plans are sent; no two
members hold one rank in a generation; only members whose hello the coordinator accepted are
planned; a completed run has every rank's ``done``; a peer plan's source holds the state it names.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

import experiments.warm.coordinator as coordinator_module
import experiments.warm.member as member_module
from experiments.warm.coordinator import Coordinator, Timing
from experiments.warm.member import CoordinatorGone, WarmMember
from experiments.warm.protocol import RESUME_CHECKPOINT, RESUME_PEER, Plan
from warm_scenario import Host, start_coordinator, warm_member

WORLD, SPARES, FIRST_ATTEMPT = 2, 1, 3  # start_coordinator's first attempt
FAILED_RANK, FAILED_STEP, CHECKPOINT_STEP, LAST_STEP = 1, 57, 50, 100

# Every timing of the harness is a multiple of this: the variants run side by side, threads of one
# process, and a thread that waits its turn for the interpreter on a busy host (CI's other lanes, a
# second test process) must not be taken for a member that is late or lost: 0.1 s was seen to fail.
TICK_S = 0.3
HELLO_S = 1.5 * TICK_S  # the challenge's and the hello's timeout, both ends (protocol.HELLO_TIMEOUT_S)
# A rendezvous and a collective give up after this: a re-formation's as its plan says (reform_s);
# generation 0's after the job's rendezvous timeout (FAULTDRILL_RENDEZVOUS_TIMEOUT_S), set as short
# here (its default, 300 s, outlasts report_s: a generation 0 that never forms would end the job).
JOIN_S = 1.5 * TICK_S
# The first generation's members connect one after the other (start_base_members: each waits for
# the one before it said hello), all within start_s: its margin is the widest.
TIMING = Timing(report_s=5 * TICK_S, reform_s=JOIN_S, spare_s=5 * TICK_S, start_s=12 * TICK_S)
# A delayed message comes twice the timing that watches it late: the peers' rendezvous watches a
# plan; nothing watches formed or done alone, but the lost that follows formed on its line does.
WATCHED_S = {"challenge": HELLO_S, "hello": HELLO_S, "plan": JOIN_S, "formed": TIMING.report_s,
             "lost": TIMING.report_s, "done": TIMING.report_s}
DELAY_FACTOR = 2.0
VARIANT_S = 40 * TICK_S  # every variant's coordinator ends by then (its longest chain of timeouts: ~15 ticks)
SETTLE_S = 25 * TICK_S  # the processes and relays of a variant end this soon after it is torn down
PARALLEL = 6  # variants at a time: they mostly wait out timeouts

BASE_MESSAGES = (
    "2 <- challenge", "2 -> hello", "0 <- challenge", "0 -> hello", "1 <- challenge", "1 -> hello",
    "0 <- plan g0", "1 <- plan g0", "0 -> formed g0", "1 -> formed g0",  # then rank 1 dies after step 57
    "0 -> lost g0", "0 <- plan g1", "2 <- plan g1", "0 -> formed g1", "2 -> formed g1", "0 -> done", "2 -> done",
)
BASE_SLOTS = (2, 0, 1)  # the spare first: the plans of generation 0 follow the last rank's hello
DROP, DELAY, KILL = "drop", "delay", "kill"

COMPLETED = "completed"
RANKS_MISSING = "the first 2 member(s) did not connect"
UNREPORTED = "a survivor did not report the step it completed"


@dataclass(frozen=True)
class Message:
    slot: int
    upward: bool  # member -> coordinator
    op: str
    generation: int | None
    body: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        arrow = "->" if self.upward else "<-"
        return f"{self.slot} {arrow} {self.op}" + ("" if self.generation is None else f" g{self.generation}")


@dataclass(frozen=True)
class Fault:
    kind: str  # DROP | DELAY | KILL
    at: str  # the label of the base message it strikes (its first passage)
    victim: int | None = None  # KILL: the slot whose process dies as that message passes

    @property
    def name(self) -> str:
        return f"kill {self.victim} at {self.at}" if self.kind == KILL else f"{self.kind} {self.at}"


@dataclass(frozen=True)
class Decision:
    drop: bool = False
    delay_s: float = 0.0
    kill_after: int | None = None  # the sender dies once its message has passed


@dataclass
class Group:
    """One generation's process group, as its members see it."""

    joined: dict[int, int] = field(default_factory=dict)  # rank: the slot that joined as it
    formed: bool = False
    at_collective: set[int] = field(default_factory=set)  # slots at the group's first collective
    trained: bool = False  # every member passed the first collective


@dataclass
class Result:
    fault: Fault | None
    outcome: str  # the verdict, or why the coordinator gave up
    problems: list[str]
    seconds: float
    labels: list[str]  # every message that passed, the base members' ones


class ProcessDied(Exception):
    """The harness killed this member's process: its thread stops at once."""


def _message(raw: bytes, slot: int, upward: bool) -> Message:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return Message(slot, upward, "?", None)
    generation = body.get("generation")
    return Message(slot, upward, str(body.get("op", "?")), generation if isinstance(generation, int) else None, body)


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()


class Relay:
    """One member's connection to the coordinator, passed on line by line: the run sees each message,
    drops it, holds it back, or kills a process as it passes (lines keep their order, as TCP's)."""

    def __init__(self, run: "Run", slot: int) -> None:
        self.run, self.slot = run, slot
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.handled = 0  # lines from the member decided on (its process waits for that: see Run.said)
        self.cut_off = False
        self._sockets: list[socket.socket] = [self.listener]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.threads = [threading.Thread(target=self._relay, daemon=True, name=f"relay-{slot}")]
        self.threads[0].start()

    def cut(self) -> None:
        """Both ends closed: the member's process is dead, or the coordinator closed its end."""
        with self._lock:
            self.cut_off = True
            self._stopped.set()
            for connection in self._sockets:
                _shut(connection)

    def _hold(self, connection: socket.socket) -> bool:
        with self._lock:
            self._sockets.append(connection)
            return not self.cut_off

    def _relay(self) -> None:
        try:
            member, _ = self.listener.accept()
            if not self._hold(member):
                return
            upstream = socket.create_connection(self.run.coordinator_address, timeout=5)
            upstream.settimeout(None)
            if not self._hold(upstream):
                return
        except OSError:
            self.cut()
            return
        for connection in (member, upstream):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        downward = threading.Thread(target=self._pump, args=(upstream, member, False), daemon=True)
        self.threads.append(downward)
        downward.start()
        self._pump(member, upstream, True)

    def _pump(self, source: socket.socket, sink: socket.socket, upward: bool) -> None:
        reader = source.makefile("rb")
        try:
            for raw in iter(reader.readline, b""):
                message = _message(raw, self.slot, upward)
                decision = self.run.passing(message)
                if decision.delay_s:
                    self._decided(upward)
                    self._stopped.wait(decision.delay_s)
                if not decision.drop:
                    sink.sendall(raw)
                if decision.kill_after is not None:
                    self.run.kill(decision.kill_after)
                if not decision.delay_s:
                    self._decided(upward)
        except (OSError, ValueError):
            pass
        finally:
            self.cut()
            self._decided(upward)

    def _decided(self, upward: bool) -> None:
        if upward:
            self.run.decided(self)


class Run:
    """One variant: the coordinator, the base members and the spares it starts (each a thread, its
    connection through a Relay), a model of their process groups, and what passed."""

    def __init__(self, fault: Fault | None) -> None:
        self.fault, self.struck = fault, False
        self.host = Host()
        self.trace: list[Message] = []
        self.sent_plans: list[tuple[int, Plan]] = []  # (slot, plan) as the coordinator sent them
        self.hellos: set[int] = set()  # slots whose hello was passed on to the coordinator
        self.dones: set[int] = set()  # slots whose done was passed on
        self.problems: list[str] = []
        self.relays: dict[int, Relay] = {}
        self.processes: dict[int, threading.Thread] = {}
        self.ended: set[int] = set()  # slots whose process ended
        self.dead: set[int] = set()  # slots whose process was killed
        self.holds: dict[int, int] = {}  # the step whose state a process holds (absent: it took none)
        self.groups: dict[int, Group] = {}
        self.said: dict[int, int] = {}  # lines each member sent
        self._lock = threading.Condition()
        self.started = time.monotonic()
        self.coordinator: Coordinator
        self.coordinator, address, self.outcome = start_coordinator(self.host, WORLD, SPARES, TIMING,
                                                                    spawn=self._spawn)
        host_name, port = address.rsplit(":", 1)
        self.coordinator_address = (host_name, int(port))

    # --- the processes ---------------------------------------------------------------------------------

    def start_base_members(self) -> None:
        """The spare, then the ranks, one after the other (each said hello, or ended, first): the
        base scenario's messages come in one order, so a kill strikes each process at one point."""
        for slot in BASE_SLOTS:
            self.launch(slot)
            self._await_hello(slot)

    def _await_hello(self, slot: int) -> None:
        relay = self.relays[slot]
        with self._lock:
            self._lock.wait_for(lambda: relay.handled >= 1 or slot in self.ended, 4 * HELLO_S)

    def launch(self, slot: int) -> None:
        with self._lock:
            self.relays[slot] = Relay(self, slot)
            self.said[slot] = 0
            process = threading.Thread(target=self._process, args=(slot,), daemon=True, name=f"member-{slot}")
            self.processes[slot] = process
        process.start()

    def _spawn(self, slot: int, attempt: int, where: coordinator_module.Placement) -> None:
        self.host.spawn(slot, attempt, where)
        self.launch(slot)

    def _process(self, slot: int) -> None:
        """A warm member: hello, then each plan's generation, until the run is over for it (done,
        exit, its coordinator gone, or killed). Its end is reported as a host reports a launch's."""
        member: WarmMember | None = None
        try:
            self._check_alive(slot)
            member = warm_member(self.relays[slot].address, slot, connect_timeout_s=HELLO_S)  # a relay cut: gone
            self._after_saying(slot)
            while (plan := member.next_plan()) is not None:
                if self._generation(member, plan):
                    break
        except (CoordinatorGone, ProcessDied, OSError):
            pass
        finally:
            if member is not None:
                member.line.close()
            self.relays[slot].cut()
            with self._lock:
                self.ended.add(slot)
                self._lock.notify_all()
            self.coordinator.launch_ended([slot])

    def _generation(self, member: WarmMember, plan: Plan) -> bool:
        """Join, take the state, train; True once the run is over for this process."""
        if not self._join(member.slot, plan):
            return self._lost(member, plan)
        self._resume(member.slot, plan)
        member.formed(plan.generation)
        self._after_saying(member.slot)
        if not self._collective(member.slot, plan.generation):
            return self._lost(member, plan)
        if plan.generation == 0:
            return self._fail_after_step_57(member, plan)
        self._trained(member.slot, LAST_STEP)
        member.done()
        self._after_saying(member.slot)
        return True

    def _fail_after_step_57(self, member: WarmMember, plan: Plan) -> bool:
        """The base scenario's fault: in generation 0, rank 1 dies after step 57; the others'
        collective then fails."""
        self._trained(member.slot, FAILED_STEP)
        if plan.rank == FAILED_RANK:
            self.kill(member.slot)
            raise ProcessDied()
        with self._lock:
            group = self.groups[plan.generation]
            self._lock.wait_for(lambda: bool(set(group.joined.values()) & self.dead), JOIN_S)
        return self._lost(member, plan)

    def _lost(self, member: WarmMember, plan: Plan) -> bool:
        self._check_alive(member.slot)
        member.lost(plan.generation, self.holds.get(member.slot, 0))
        self._after_saying(member.slot)
        return False

    def _after_saying(self, slot: int) -> None:
        """A member goes on once its relay decided on its line: a kill meant to strike it right
        after that line strikes it before it does anything else."""
        with self._lock:
            self.said[slot] += 1
            relay = self.relays[slot]
            self._lock.wait_for(lambda: relay.handled >= self.said[slot] or relay.cut_off, SETTLE_S)
        self._check_alive(slot)

    def decided(self, relay: Relay) -> None:
        with self._lock:
            relay.handled += 1
            self._lock.notify_all()

    def _check_alive(self, slot: int) -> None:
        with self._lock:
            if slot in self.dead:
                raise ProcessDied()

    # --- the model of the process groups -------------------------------------------------------------

    def _join(self, slot: int, plan: Plan) -> bool:
        """The generation's rendezvous: formed once every rank joined, each alive; a member gives up
        after the plan's join timeout (generation 0's: JOIN_S) and leaves it."""
        with self._lock:
            group = self.groups.setdefault(plan.generation, Group())
            other = group.joined.get(plan.rank)
            if other is not None and other != slot:
                self.problems.append(f"generation {plan.generation}: slots {other} and {slot} both joined as "
                                     f"rank {plan.rank}")
            group.joined[plan.rank] = slot
            self._lock.notify_all()

            def complete() -> bool:
                return len(group.joined) == WORLD and not set(group.joined.values()) & self.dead

            self._lock.wait_for(lambda: slot in self.dead or group.formed or complete(),
                                plan.join_timeout_s or JOIN_S)
            if slot in self.dead:
                raise ProcessDied()
            group.formed = group.formed or complete()
            if not group.formed and group.joined.get(plan.rank) == slot:
                del group.joined[plan.rank]
            return group.formed

    def _resume(self, slot: int, plan: Plan) -> None:
        with self._lock:
            if plan.resume == RESUME_PEER:
                self.holds[slot] = plan.step
            elif plan.resume == RESUME_CHECKPOINT:
                self.holds[slot] = CHECKPOINT_STEP
            else:
                self.holds.setdefault(slot, 0)

    def _collective(self, slot: int, generation: int) -> bool:
        """The group's first collective: passed once every member reached it; failed when one died
        (or it timed out)."""
        with self._lock:
            group = self.groups[generation]
            group.at_collective.add(slot)
            self._lock.notify_all()
            members = set(group.joined.values())
            self._lock.wait_for(lambda: group.trained or members <= group.at_collective or bool(members & self.dead),
                                JOIN_S)
            if slot in self.dead:
                raise ProcessDied()
            group.trained = group.trained or members <= group.at_collective
            return group.trained

    def _trained(self, slot: int, step: int) -> None:
        with self._lock:
            self.holds[slot] = step

    def kill(self, slot: int) -> None:
        with self._lock:
            self._kill(slot)

    def _kill(self, slot: int) -> None:
        self.dead.add(slot)
        relay = self.relays.get(slot)
        if relay is not None:
            relay.cut()
        self._lock.notify_all()

    # --- what passes -------------------------------------------------------------------------------------

    def passing(self, message: Message) -> Decision:
        """Record ``message``; the fault strikes at its first passage."""
        with self._lock:
            self.trace.append(message)
            decision = self._strike(message) if self._strikes(message) else Decision()
            if message.op == "plan" and not message.upward:
                self._planned(message)
            if message.upward and not decision.drop and message.op in ("hello", "done"):
                (self.hellos if message.op == "hello" else self.dones).add(message.slot)
            return decision

    def _strikes(self, message: Message) -> bool:
        return self.fault is not None and not self.struck and message.label == self.fault.at

    def _strike(self, message: Message) -> Decision:
        assert self.fault is not None
        self.struck = True
        if self.fault.kind == DROP:
            return Decision(drop=True)
        if self.fault.kind == DELAY:
            return Decision(delay_s=DELAY_FACTOR * WATCHED_S[message.op])
        victim = self.fault.victim
        assert victim is not None
        if message.upward and victim == message.slot:
            return Decision(kill_after=victim)  # it said its line, then died
        self._kill(victim)  # it dies as this line passes (its own: before it reads it)
        return Decision()

    def _planned(self, message: Message) -> None:
        """A plan the coordinator sent: recorded (in the host's order too: after its fence), and a peer
        plan's source checked: the process planned as the source holds the state of the step named."""
        plan = Plan.from_message(message.body)
        self.sent_plans.append((message.slot, plan))
        self.host.order.append(f"sent plan {plan.attempt}")
        if plan.resume != RESUME_PEER:
            return
        slots = self._plan_slots().get(plan.generation, {})
        source = slots.get(plan.source_rank if plan.source_rank is not None else -1)
        if source is None or self.holds.get(source) != plan.step:
            self.problems.append(f"generation {plan.generation}: the source rank {plan.source_rank} (slot {source}) "
                                 f"holds step {self.holds.get(source) if source is not None else None}, "
                                 f"not {plan.step}: it never took that state")

    def _plan_slots(self) -> dict[int, dict[int, int]]:
        """Each generation's ranks: rank -> slot, from the coordinator's warm_plan events."""
        return {event["generation"]: {int(rank): slot for rank, slot in event["slots"].items()}
                for _, event in self.host.named("warm_plan")}

    # --- the end of a variant ------------------------------------------------------------------------------

    def finish(self) -> Result:
        """The coordinator's end awaited (bounded), every process and relay ended, the promises checked."""
        serving = self.outcome["thread"]
        serving.join(VARIANT_S)
        seconds = time.monotonic() - self.started
        problems = [f"the coordinator did not end within {VARIANT_S:g} s"] if serving.is_alive() else []
        self._tear_down()
        problems += self._leftovers()
        with self._lock:
            problems += self.problems + self._broken_promises()
            labels = [message.label for message in self.trace if message.slot in BASE_SLOTS]
        return Result(self.fault, self.verdict, problems, seconds, labels)

    @property
    def verdict(self) -> str:
        return str(self.outcome.get("verdict") or self.outcome.get("gave_up") or "no verdict")

    def _tear_down(self) -> None:
        """The job ends: every process still running is killed, every relay cut."""
        with self._lock:
            for slot in list(self.relays):
                self._kill(slot)

    def _leftovers(self) -> list[str]:
        deadline = time.monotonic() + SETTLE_S
        with self._lock:
            threads = [*self.processes.values(), *(thread for relay in self.relays.values() for thread in relay.threads)]
        for thread in threads:
            # registered before it was started (a launch, a relay's second pump): started soon
            while thread.ident is None and time.monotonic() < deadline:
                time.sleep(0.001)
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return [f"{thread.name} still runs after the teardown" for thread in threads
                if thread.is_alive() or thread.ident is None]

    def _broken_promises(self) -> list[str]:
        plans = [event for _, event in self.host.named("warm_plan")]
        generations = [event["generation"] for event in plans]
        problems = [] if generations == list(range(len(generations))) else [f"generations planned: {generations}"]
        forward = [FIRST_ATTEMPT + generation for generation in generations if generation > 0]
        if self.host.fences != forward:
            problems.append(f"fences {self.host.fences}: one per generation after the first, forward, is {forward}")
        problems += self._plans_before_their_fence()
        problems += self._misplanned(plans)
        if self.verdict == COMPLETED and plans:
            missing = sorted(rank for rank, slot in plans[-1]["slots"].items() if slot not in self.dones)
            problems += [f"completed without the done of rank(s) {missing}"] if missing else []
        if self.fault is not None and not self.struck:
            problems.append(f"the fault never struck: {self.fault.at} never passed")
        return problems

    def _plans_before_their_fence(self) -> list[str]:
        order = self.host.order
        problems = []
        for attempt in self.host.fences:
            fenced_at = order.index(f"fence {attempt}")
            early = [entry for entry in order[:fenced_at] if entry in (f"plan {attempt}", f"sent plan {attempt}")]
            problems += [f"attempt {attempt}: {early} before its fence"] if early else []
        unfenced = sorted({plan.attempt for _, plan in self.sent_plans
                           if plan.generation > 0 and plan.attempt not in self.host.fences})
        return problems + ([f"plans of attempt(s) {unfenced} sent, never fenced"] if unfenced else [])

    def _misplanned(self, plans: list[dict[str, Any]]) -> list[str]:
        """Each generation: every rank once, each to its own slot, each slot one whose hello the
        coordinator accepted; the plans sent say what the generation's event says."""
        refused = {event["slot"] for _, event in self.host.named("warm_refused")}
        accepted = self.hellos - refused
        problems = []
        for event in plans:
            slots = {int(rank): slot for rank, slot in event["slots"].items()}
            if sorted(slots) != list(range(WORLD)) or len(set(slots.values())) != WORLD:
                problems.append(f"generation {event['generation']}: ranks to slots {slots}")
            if set(slots.values()) - accepted:
                problems.append(f"generation {event['generation']} plans slot(s) {sorted(set(slots.values()) - accepted)}"
                                f", whose hello the coordinator never accepted")
        planned = self._plan_slots()
        seen: set[tuple[int, int]] = set()
        for slot, plan in self.sent_plans:
            if planned.get(plan.generation, {}).get(plan.rank) != slot or (plan.generation, slot) in seen:
                problems.append(f"slot {slot} was sent rank {plan.rank} of generation {plan.generation}; "
                                f"the generation's ranks: {planned.get(plan.generation)}")
            seen.add((plan.generation, slot))
        return problems


def _lifetime(slot: int) -> tuple[str, ...]:
    """The base messages that pass while the process of ``slot`` lives: up to its last own."""
    last = max(index for index, label in enumerate(BASE_MESSAGES) if label.startswith(f"{slot} "))
    return BASE_MESSAGES[:last + 1]


DROPS = [Fault(DROP, label) for label in BASE_MESSAGES]
DELAYS = [Fault(DELAY, label) for label in BASE_MESSAGES]
KILLS = [Fault(KILL, label, slot) for slot in BASE_SLOTS for label in _lifetime(slot)]


def _run(fault: Fault | None) -> Result:
    run = Run(fault)
    run.start_base_members()
    return run.finish()


def _run_all(faults: list[Fault]) -> list[Result]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(_run, faults))


@pytest.fixture(autouse=True)
def short_hello(monkeypatch: pytest.MonkeyPatch) -> None:
    """The challenge's and the hello's timeout (10 s in a job) as short as the harness's other timings."""
    monkeypatch.setattr(coordinator_module, "HELLO_TIMEOUT_S", HELLO_S)
    monkeypatch.setattr(member_module, "HELLO_TIMEOUT_S", HELLO_S)


def _ranks_killed_before_their_hello() -> dict[str, str]:
    return {Fault(KILL, label, rank).name: RANKS_MISSING for rank in range(WORLD)
            for label in BASE_MESSAGES[:BASE_MESSAGES.index(f"{rank} -> hello")]}


# Every variant completes but these, which give up by design, naming what was missing.
GIVE_UPS = {
    # A rank's challenge or hello lost, or late past the hello's timeout, or its process dead before
    # its hello: refused (or never there). Ranks are slots 0 and 1 until the first plan; a spare
    # stands in only for a rank of a generation planned: the job gives up after start_s.
    **{Fault(kind, label).name: RANKS_MISSING for kind in (DROP, DELAY)
       for label in ("0 <- challenge", "0 -> hello", "1 <- challenge", "1 -> hello")},
    **_ranks_killed_before_their_hello(),
    # A member whose plan was lost waits for one: it has no step to report; a survivor's lost that
    # never comes, or comes after report_s (late itself, or behind a late formed on its line): the
    # coordinator cannot tell a lost line from a hung member (TCP loses none on a live connection).
    **{Fault(DROP, label).name: UNREPORTED
       for label in ("0 <- plan g0", "1 <- plan g0", "0 -> lost g0", "0 <- plan g1", "2 <- plan g1")},
    Fault(DELAY, "0 -> lost g0").name: UNREPORTED,
    Fault(DELAY, "0 -> formed g0").name: UNREPORTED,
}
# Completed by design, though not as the base scenario: a plan late past the rendezvous timeout: its
# peers report lost, the late one too once its own rendezvous gave up, and the next generation
# re-forms the same members. A spare's lost or late challenge or hello, or its death: another is
# started. A lost done: the rank's exit then reads as its death, and two new spares redo the run's
# end from the newest checkpoint (the coordinator cannot tell a lost done from a death after it).


def _expected(fault: Fault) -> str:
    return GIVE_UPS.get(fault.name, COMPLETED)


def _as_expected(result: Result) -> bool:
    assert result.fault is not None
    expected = _expected(result.fault)
    return result.outcome == expected if expected == COMPLETED else expected in result.outcome


def _assert_every_variant_holds(faults: list[Fault]) -> None:
    results = _run_all(faults)
    wrong = [f"{result.fault.name if result.fault else None}: {result.outcome!r} "
             f"(expected {_expected(result.fault) if result.fault else None!r}); {result.problems}"
             for result in results if result.problems or not _as_expected(result)]
    slowest = max(results, key=lambda result: result.seconds)
    print(f"{len(results)} variants; the slowest: {slowest.fault.name if slowest.fault else None} "
          f"({slowest.seconds:.2f} s)")
    assert not wrong, "\n".join(wrong)


def test_the_base_scenario_re_forms_with_the_spare_and_completes() -> None:
    run = Run(None)
    run.start_base_members()
    result = run.finish()
    print(f"base scenario: N = {len(BASE_MESSAGES)} messages; variants: {len(DROPS)} dropped, {len(DELAYS)} "
          f"delayed, {len(KILLS)} kills: {len(DROPS) + len(DELAYS) + len(KILLS)}")
    assert (result.outcome, result.problems) == (COMPLETED, []), result
    assert sorted(result.labels) == sorted(BASE_MESSAGES), result.labels
    taken = [(slot, plan) for slot, plan in run.sent_plans if plan.generation == 1]
    assert sorted((slot, plan.rank, plan.resume, plan.source_rank, plan.step) for slot, plan in taken) == [
        (0, 0, RESUME_PEER, 0, FAILED_STEP), (2, 1, RESUME_PEER, 0, FAILED_STEP)]
    assert run.host.fences == [FIRST_ATTEMPT + 1] and run.dones == {0, 2}
    assert [event["rank"] for _, event in run.host.named("warm_failure")] == [FAILED_RANK]


def test_every_message_dropped_holds_every_invariant() -> None:
    _assert_every_variant_holds(DROPS)


def test_every_message_delayed_past_its_timing_holds_every_invariant() -> None:
    _assert_every_variant_holds(DELAYS)


def test_every_member_killed_as_each_message_passes_holds_every_invariant() -> None:
    _assert_every_variant_holds(KILLS)
