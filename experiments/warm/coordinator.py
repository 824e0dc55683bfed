"""The warm strategy's coordinator: one per job, beside its ranks (the local backend's job process;
on Slurm, the batch script's); of a framework it uses only PyTorch's rendezvous store, which it
hosts for each generation (``store_host.py``).

Every process of the job (the ranks and the warm spares: framework imported, model built, idle)
holds a connection to it. When a rank's connection ends (its process died) the coordinator waits
for the survivors to report the step they completed (their collective failed: they dropped the
broken step and left their group), gives the dead rank's number to a warm spare, and sends every
member the plan of the next generation: a new rendezvous, the survivor whose state everyone takes
(the highest step: no rollback), or the newest valid checkpoint when no survivor is left. Then it
starts a spare in place of the one it used.

TensorFlow and Chainer cannot drop a member from their collectives (``restart_all``): their warm
spares come as whole sets, one process per rank, each set launched together (one ``mpiexec``, or
one TF_CONFIG) with its collective formed, its model built and its step traced before any fault.
A failure ends the whole active set, but not before its survivors hand over their state: each is
told to ``hold`` (no update after the step it completed: its workload's StateGate) and serves the
state on its own authenticated port (``state_channel.py``); the next complete spare set takes it
from the survivor with the highest step (no rollback) and the survivors are retired once that set
formed. With no survivor holding a step (none served, or all died), the set resumes from the
newest valid checkpoint. A new set is started in place of the one used. Slots are numbered
set by set: slot ``s`` is rank ``s % world_size`` of set ``s // world_size``.

It writes what it saw and did as events of the attempt
(``warm_failure``, ``warm_plan``, ``warm_formed``; the ranks add the attempt's usual timeline), which the controller turns
into the recovery's row. It gives up (``CoordinatorGaveUp``: the job fails, the controller's policy
takes over) when a member stops answering or no spare comes in time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from experiments.layout import (
    EVENT_STAMPED_ON,
    EVENT_WARM_FAILURE,
    EVENT_WARM_FORMED,
    EVENT_WARM_PLAN,
    EVENT_WARM_REFUSED,
)
from experiments.runtime.distenv import node_name
from experiments.warm.protocol import (
    HELLO_TIMEOUT_S,
    RESUME_CHECKPOINT,
    RESUME_PEER,
    RESUME_START,
    Line,
    MalformedMessage,
    Plan,
    Unproven,
    accepted,
    coordinator_proof,
    new_nonce,
    proven,
    shut,
)
from experiments.warm.store_host import StoreHost

log = logging.getLogger(__name__)

EventSink = Callable[[int, dict[str, Any]], None]  # an event of that attempt
SpawnSpare = Callable[[int, int, "Placement"], None]  # start a warm spare (a set): slot, attempt, where
Fence = Callable[[int], None]  # make that attempt the run's current one (in this job)
ExitCode = Callable[[int], "int | None"]  # how the process of that slot ended, if the host knows
EndSlots = Callable[[list[int]], None]  # restart_all: end these slots' processes (a retired set)
ACTIVE, SPARE, GONE, DONE, RETIRED = "active", "spare", "gone", "done", "retired"
SERVING = "serving"  # restart_all: a survivor of a failed set, its state held and served until the next set formed
# Spares whose launches end before their hello are started again, this many in a row (a launch onto
# a node that is down fails at once, again and again).
FAILED_LAUNCHES_REPLACED = 3
# Re-formations in a row whose group never formed (every rendezvous failed, or a member died in each)
# before the job gives up: the controller's policy restarts the run in a new job, from a checkpoint.
UNFORMED_GENERATIONS = 3
# Connections that have not proven the job's secret yet, at most: a newer one takes the oldest's
# place (shut, counted as refused), so a stranger who holds them all cannot keep a member out, and
# its flood cannot take the job's threads and descriptors; a member whose connection ends before
# its challenge connects again (experiments/warm/member.py). An accept that fails (descriptors
# out) waits, then goes on.
MAX_UNPROVEN = 32
# Refusals: each of the first few is an event of its own (its slot, why); after them, one event per
# REFUSALS_BATCH_S carries how many came meanwhile, so a flood does not grow the user's files.
REFUSALS_EACH = 20
REFUSALS_BATCH_S = 10.0
REFUSAL_WHY_CHARS = 200  # of a refusal's reason, which may quote what a stranger sent
WARNED = "warned"  # a rank that saved on the scheduler's warning and holds until the job ends


@dataclass(frozen=True)
class Placement:
    """Where the host should start a spare: ``node`` (one process; None: the host's choice), never
    on the nodes in ``avoid`` (their every member died at once: the node may be down)."""

    node: str | None = None
    avoid: frozenset[str] = frozenset()


THIS_NODE = node_name(os.environ, socket.gethostname())  # whose clock stamps the coordinator's events
ANYWHERE = Placement()  # the host's choice of node, none avoided (a default argument: Placement is frozen)


class SpareNotStarted(RuntimeError):
    """The host cannot start that spare (e.g. too few live nodes for a set): none is on its way."""


class CoordinatorGaveUp(RuntimeError):
    """The job cannot go on warm: a member stopped answering, or no spare came in time."""


@dataclass
class Member:
    slot: int
    node: str
    address: str
    pid: int
    line: Line
    role: str = SPARE
    rank: int | None = None
    lost_step: int | None = None  # reported after its collective failed (this re-formation)
    lost_why: str = ""  # its collective's error, in its words
    warm_at: float = field(default_factory=time.time)  # when it said hello: set up and waiting
    nonce: str = ""  # its hello's: each plan answers it with the job's secret (coordinator_proof)
    state_port: int = 0  # restart_all: where it serves its held state (0: it serves none)
    held_step: int | None = None  # restart_all: it holds the state after this step (its "held")


@dataclass
class Timing:
    report_s: float = 30.0  # a survivor that has not reported its step by then: the job gives up
    # A re-formation's rendezvous, in each member: one whose planned spare died before it joined
    # gives up by then and reports lost (well within report_s), so another spare is planned in.
    reform_s: float = 15.0
    spare_s: float = 120.0  # no warm spare by then: the job gives up
    start_s: float = 600.0  # the first generation's members all connected by then
    # While a re-formation awaits the survivors' reports, the failed generation's store is voided
    # again this often (a member that connected after the last void waits there otherwise).
    void_again_s: float = 1.0
    # restart_all: a survivor's answer to "hold" (its update in progress finishes first), at most
    hold_s: float = 5.0


@dataclass
class Coordinator:
    world_size: int
    spares_wanted: int
    first_attempt: int  # generation g is the run's attempt first_attempt + g
    port_base: int  # without stores: generation g's rank 0 hosts its rendezvous at port_base + g
    events: EventSink
    fence: Fence
    secret: str  # the job's warm channel secret (hex): a hello must prove it (protocol.proof)
    spawn: SpawnSpare | None = None  # restart_all: starts the whole set whose first slot it is given
    exit_code: ExitCode | None = None
    timing: Timing = field(default_factory=Timing)
    # TensorFlow, Chainer: every rank restarts, in a warm spare set (spares_wanted counts sets).
    restart_all: bool = False
    end: EndSlots | None = None
    # PyTorch (peer mode): each generation's rendezvous store, hosted here (outlives every rank)
    stores: StoreHost | None = None
    generation: int = -1
    members: dict[int, Member] = field(default_factory=dict)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _failed_at: float | None = None
    _formed: set[int] = field(default_factory=set)
    _generation_formed: bool = False  # every member of the current generation said formed
    _unformed_in_a_row: int = 0  # re-formations since the last generation that formed
    _failure_told: bool = False  # the current generation's failure is in a warm_failure event
    _voided: bool = False  # the current generation's store was voided on its first failure sign
    _source: Member | None = None  # restart_all: the survivor the current generation takes its state from
    _next_slot: int = 0
    _pending: set[int] = field(default_factory=set)  # spare slots started that have not said hello yet
    _broken_sets: set[int] = field(default_factory=set)  # restart_all: spare sets that lost a member
    _failed_nodes: set[str] = field(default_factory=set)  # the nodes of the active members lost since the last plan
    _verdict: str | None = None  # "completed" | why it gave up
    _released: bool = False  # the run is over: a member that says hello now is told to exit
    _warned_step: int | None = None  # the ranks saved this step on the scheduler's warning: no re-formation
    _spares_awaited: int | None = None  # a re-formation waits for this many spares (sets) now
    _failed_launches: int = 0  # spares (sets) whose launch ended before they said hello, since one did
    refused: int = 0  # connections turned away (no proof, a slot not launched or held)
    _unproven: Unproven = field(default_factory=lambda: Unproven(MAX_UNPROVEN))
    _joining: set[int] = field(default_factory=set)  # slots proven and admitted, not in members yet
    _refusals_unrecorded: int = 0  # refused after the first REFUSALS_EACH, not in an event yet
    _refusals_recorded_at: float = 0.0

    # --- the server ---------------------------------------------------------------------------------

    def serve(self, listener: socket.socket) -> str:
        """Accept members on ``listener`` until the run completes; the verdict ("completed")."""
        self._next_slot = self.world_size + self.spares_wanted * self._spare_unit
        with self._lock:  # the host started the first spares with the ranks: on their way
            self._pending |= set(range(self.world_size, self._next_slot)) - set(self.members)
        threading.Thread(target=self._accept, args=(listener,), name="warm-accept", daemon=True).start()
        try:
            self._open_store(0)  # while the first members start
            self._drive()
            return self._verdict or "completed"
        finally:
            self._release_spares()
            _close_listener(listener)
            if self.stores is not None:
                self.stores.close_all()
            with self._lock:
                self._record_refusals()

    def abort(self, why: str) -> None:
        """End ``serve`` with CoordinatorGaveUp (the host saw every process of the job exit)."""
        with self._lock:
            self._verdict = why
            self._lock.notify_all()

    def launch_ended(self, slots: list[int]) -> None:
        """The host saw the launch of these slots end: those that never said hello are not on their
        way any more (a launch on a node that is down fails without a word), and a spare set that
        lost one can never form."""
        with self._lock:
            never_came = {slot for slot in slots if slot in self._pending}
            self._pending -= never_came
            if self.restart_all:
                for number in {self._set_of(slot) for slot in never_came}:
                    self._break_set(number)
            # A single spare is started again (a few times in a row at most); a set's failed launch
            # broke it: none of it is on its way, the job gives up now if no other set can take over.
            if never_came:  # one per report: a host reports together what ended together
                self._failed_launches += 1
            if never_came and not self.restart_all and self._verdict is None and not self._released \
                    and self._failed_launches <= FAILED_LAUNCHES_REPLACED:
                self._replace_spares()
            self._lock.notify_all()

    def _accept(self, listener: socket.socket) -> None:
        while (connection := accepted(listener, _warn_accept)) is not None:  # None: the job is over
            self._unproven.admit(connection)  # the oldest shut for it: its thread finds no hello, refused, counted
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keepalive(connection)
            threading.Thread(target=self._listen, args=(Line(connection),), name="warm-member", daemon=True).start()

    def _listen(self, line: Line) -> None:
        try:
            member = self._admitted(line)
        finally:
            self._unproven.settled(line.connection)
        if member is None:
            return
        with self._lock:
            self._joining.discard(member.slot)
            if self._released:
                _let_go(line)
                return
            self.members[member.slot] = member
            self._pending.discard(member.slot)
            self._failed_launches = 0
            if self.restart_all and self._set_of(member.slot) in self._broken_sets:
                self._retire([member])  # its set lost a member before it was warm
            self._lock.notify_all()
        while (message := self._next_message(member)) is not None:
            with self._lock:
                try:
                    self._on_message(member, message)
                except MalformedMessage as error:  # a member that went wrong: taken as gone, as a bad line is
                    log.warning("warm: slot %d sent %s: taken as gone", member.slot, error)
                    member.line.close()
                    break
                finally:
                    self._lock.notify_all()
        with self._lock:
            if member.role in (ACTIVE, SPARE):
                self._on_gone(member)
            elif member.role in (WARNED, SERVING):
                member.role = GONE  # it held after the warning (or served its state), then ended: no failure
            self._lock.notify_all()

    def _admitted(self, line: Line) -> Member | None:
        """The member behind a new connection, once it proved the job's secret for a slot the job
        launched and nobody holds; else the connection is closed and the refusal recorded."""
        nonce = new_nonce()
        line.connection.settimeout(HELLO_TIMEOUT_S)
        # HELLO_TIMEOUT_S for the whole hello, not for each read (a byte at a time kept it open).
        deadline = threading.Timer(HELLO_TIMEOUT_S, shut, args=(line.connection,))
        deadline.start()
        try:
            line.send({"op": "challenge", "nonce": nonce})
            hello = line.receive()
            member = _member_of(hello, line)
        except (OSError, MalformedMessage, KeyError, TypeError, ValueError) as error:
            self._refuse(line, None, f"no hello: {error}")
            return None
        finally:
            deadline.cancel()
        line.connection.settimeout(None)
        if member is None:
            self._refuse(line, None, "no hello")
            return None
        if not proven(self.secret, nonce, member.slot, member.pid, str(hello.get("proof", "")) if hello else ""):
            self._refuse(line, member.slot, "its hello does not prove the job's secret")
            return None
        with self._lock:
            why = self._slot_refused(member.slot)
            if not why:
                self._joining.add(member.slot)  # two connections for one slot: the second finds it held
        if why:
            self._refuse(line, member.slot, why)
            return None
        return member

    def _slot_refused(self, slot: int) -> str | None:
        """Why ``slot`` may not join: held already, or not one the job launched (a rank's before the
        first plan, or a spare started and not yet connected)."""
        if slot in self.members or slot in self._joining:
            return f"slot {slot} is held"
        if slot in self._pending or (self.generation < 0 and 0 <= slot < self.world_size):
            return None
        if self.restart_all and self._set_of(slot) in self._broken_sets and 0 <= slot < self._next_slot:
            return None  # launched, its set broken before it was warm: admitted, then retired
        return f"slot {slot} was not launched by this job"

    def _refuse(self, line: Line, slot: int | None, why: str) -> None:
        """Recorded, then closed: whoever sees the connection end finds the refusal counted. What is
        recorded of the stranger's words is bounded (the reason may quote them)."""
        why = why if len(why) <= REFUSAL_WHY_CHARS else why[:REFUSAL_WHY_CHARS - 3] + "..."
        slot = slot if slot is not None and abs(slot) < 1 << 31 else None
        with self._lock:
            self.refused += 1
            if self.refused <= REFUSALS_EACH:
                log.warning("warm: a connection refused (slot %s): %s", slot, why)
                self._event({"event": EVENT_WARM_REFUSED, "time": time.time(), "slot": slot, "why": why,
                             "refused": self.refused, "count": 1})
            else:
                self._refusals_unrecorded += 1
                if time.time() - self._refusals_recorded_at >= REFUSALS_BATCH_S:
                    self._record_refusals(why)
        line.close()

    def _record_refusals(self, why: str = "") -> None:
        """The refusals not recorded one by one, as one event (under the lock)."""
        if not self._refusals_unrecorded:
            return
        log.warning("warm: %d more connections refused (the last: %s)", self._refusals_unrecorded, why)
        self._event({"event": EVENT_WARM_REFUSED, "time": time.time(), "slot": None, "why": f"and more: {why}",
                     "refused": self.refused, "count": self._refusals_unrecorded})
        self._refusals_unrecorded, self._refusals_recorded_at = 0, time.time()

    def _next_message(self, member: Member) -> dict[str, Any] | None:
        """None once the member is gone; a malformed line from it is taken as its end."""
        try:
            return member.line.receive()
        except MalformedMessage as error:
            log.warning("warm: slot %d sent %s: taken as gone", member.slot, error)
            member.line.close()
            return None

    # --- what members say ----------------------------------------------------------------------------

    def _on_message(self, member: Member, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "formed" and message.get("generation") == self.generation:
            self._formed.add(member.slot)
            if self._formed >= self._active_slots() and not self._generation_formed:
                self._generation_formed = True
                self._event({"event": EVENT_WARM_FORMED, "time": time.time(), "generation": self.generation})
        elif op == "lost":
            step = _step_of(message)
            if message.get("generation") != self.generation or member.role != ACTIVE:
                return  # of a generation already replaced (a set member that held after its plan went out)
            member.lost_step = step
            member.lost_why = str(message.get("why") or "")
            if message.get("source_failed") is True and self._source is not None:
                self._source.held_step = None  # its state could not be taken: no source again (the checkpoint is)
            if self._failed_at is None:  # a collective failed before any connection ended (a hang)
                self._failed_at = time.time()
            self._void_rendezvous(first_sign=True)
        elif op == "held":
            member.held_step = _step_of(message)
        elif op == "warned":
            member.role = WARNED
            self._warned_step = _step_of(message)
        elif op == "done":
            member.role = DONE

    def _on_gone(self, member: Member) -> None:
        was = member.role
        member.role = GONE
        if was == ACTIVE and self._warned_step is not None:
            return  # the job is ending on the scheduler's warning: a rank's end is no failure to re-form from
        if was == ACTIVE:
            now = time.time()
            if self._failed_at is None:
                self._failed_at = now
            self._void_rendezvous(first_sign=True)
            self._failed_nodes.add(member.node)
            code = self.exit_code(member.slot) if self.exit_code is not None else None
            self._failure_told = True
            self._event({"event": EVENT_WARM_FAILURE, "time": now, "generation": self.generation, "rank": member.rank,
                         "slot": member.slot, "node": member.node, "pid": member.pid, "exit_code": code})
        elif was == SPARE and self._verdict is None:
            if self.restart_all:  # a set that lost a member can never form its collective again
                self._break_set(self._set_of(member.slot))
            self._replace_spares()

    # --- the loop -------------------------------------------------------------------------------------

    def _drive(self) -> None:
        with self._lock:
            # Rank r is slot r at first: the host placed the ranks' slots on the nodes as the job's
            # own tasks would be; the spares come after them.
            self._wait(lambda: all(slot in self.members for slot in range(self.world_size)), self.timing.start_s,
                       f"the first {self.world_size} member(s) did not connect")
            first = {rank: self.members[rank] for rank in range(self.world_size)}
            gone = [member for member in first.values() if member.role == GONE]  # ended after its hello
            self._send_plans(first, RESUME_START, None, 0)
            for member in gone:  # dead as its plan went out: the first generation's failure, a spare takes over
                self._on_gone(member)
            while True:
                self._lock.wait_for(lambda: self._done() or self._failed_at is not None or self._verdict is not None
                                    or self._warned_step is not None or self._servers_to_retire())
                self._check_aborted()
                if self._servers_to_retire() and self._failed_at is None:
                    self._retire(self._of_role(SERVING))  # the set that took their state formed
                    continue
                if self._done():
                    self._verdict = "completed"
                    return
                if self._warned_step is not None:
                    self._hold_warned()
                    return
                if self.restart_all:
                    self._restart_all()
                else:
                    self._reform()

    def _hold_warned(self) -> None:
        """The scheduler's warning: the ranks saved a step and hold until the job ends. Nothing
        re-forms now (a rank's end is the job's); the verdict once every rank has ended."""
        self._lock.wait_for(lambda: not self._of_role(ACTIVE) and not self._of_role(WARNED)
                            or (self._verdict is not None and self._verdict != "completed"))
        self._check_aborted()
        self._verdict = f"warned: the ranks saved step {self._warned_step} on the scheduler's warning"

    def _reform(self) -> None:
        """Survivors' steps in, a spare for each dead rank, the next generation's plans out. A
        survivor that dies while the spares are awaited (the lock is let go meanwhile) is dead
        too: the survivors are counted again once the spares are there."""
        while True:
            self._await_reports()
            survivors = self._of_role(ACTIVE)
            self._tell_failure_of_the_living(survivors)
            dead_ranks = sorted(set(range(self.world_size)) - {m.rank for m in survivors if m.rank is not None})
            wanted = len(dead_ranks)
            self._awaiting(wanted, lambda: len(self._of_role(SPARE)) >= wanted,  # noqa: B023 - called within this turn
                           f"no warm spare for rank(s) {dead_ranks}")
            if all(member.role == ACTIVE for member in survivors):
                break
        spares = sorted(self._of_role(SPARE), key=lambda m: m.slot)[:len(dead_ranks)]
        ranks = {m.rank: m for m in survivors if m.rank is not None}
        ranks.update(zip(dead_ranks, spares, strict=False))
        # The state comes from a survivor that trained; a spare planned in whose generation never
        # formed reports step 0 (it took no state): with no other, the newest valid checkpoint.
        holders = [m for m in survivors if m.lost_step]
        source = max(holders, key=lambda m: (m.lost_step or 0, -(m.rank or 0)), default=None)
        resume = RESUME_PEER if source is not None else RESUME_CHECKPOINT
        step = (source.lost_step or 0) if source is not None else 0
        self._send_plans(ranks, resume, source.rank if source is not None else None, step,
                         spares={m.slot: rank for rank, m in ranks.items() if m in spares})
        self._replace_spares()

    def _await_reports(self) -> None:
        """Every active member's report of the step it completed (or its end), within report_s. With
        the stores here, the failed generation's is voided again each ``void_again_s`` meanwhile: a
        member that connected to it after the last void stops waiting there too."""
        deadline = time.monotonic() + self.timing.report_s
        while not self._all_reported():
            left = deadline - time.monotonic()
            if left <= 0:
                raise CoordinatorGaveUp(f"warm: a survivor did not report the step it completed (is it hung?) "
                                        f"within {self.timing.report_s:g} s")
            period = left if self.stores is None else min(self.timing.void_again_s, left)
            if not self._lock.wait_for(lambda: self._all_reported() or self._verdict is not None, timeout=period):
                self._void_rendezvous()
            self._check_aborted()

    def _all_reported(self) -> bool:
        """Every active member reported the step it completed (its collective failed)."""
        return all(member.lost_step is not None for member in self._of_role(ACTIVE))

    def _open_store(self, generation: int) -> int:
        """The port of ``generation``'s store (none: 0); one that cannot start here ends the job."""
        if self.stores is None:
            return 0
        try:
            return self.stores.open(generation)
        except Exception as error:  # torch missing, no port, the host's own name not answering
            raise CoordinatorGaveUp(f"warm: generation {generation}'s rendezvous store could not start on "
                                    f"{self.stores.address}: {error}") from error

    def _void_rendezvous(self, first_sign: bool = False) -> None:
        """The current generation failed: its store ends, so the members still in its rendezvous
        (waiting on a rank that died there) stop waiting now, not at their join's timeout. On the
        first sign of its failure only (the others' reports and deaths follow in a burst: each void
        starts a store); after that, each ``void_again_s`` while reports are awaited."""
        if self.stores is None or (first_sign and self._voided):
            return
        self._voided = True
        self.stores.void(self.generation)

    def _tell_failure_of_the_living(self, reported: list[Member]) -> None:
        """A generation that failed with no member's end (every collective or rendezvous failed: a
        hang, a rendezvous that never answered) is the attempt's failure all the same: told to the
        controller as one (its policy counts it, as it counts a dead rank)."""
        if self._failure_told or not reported:
            return
        first = min(reported, key=lambda m: m.rank if m.rank is not None else self.world_size)
        stage = "its collectives" if self._generation_formed else "its rendezvous"
        words = f": {first.lost_why}" if first.lost_why else ""
        self._failure_told = True
        self._event({"event": EVENT_WARM_FAILURE, "time": self._failed_at or time.time(), "generation": self.generation,
                     "rank": first.rank, "slot": first.slot, "node": first.node, "pid": first.pid, "exit_code": -1,
                     "what": f"generation {self.generation}: {stage} failed on rank {first.rank}, no rank died{words}"})

    def _restart_all(self) -> None:
        """The active set's survivors hold their state (those that serve none are retired), the next
        complete spare set takes the state of the one with the highest step (none: the newest
        valid checkpoint), a new set is started in its place. The survivors are retired once that
        set formed (``_drive``); until then they stay sources, for a set that fails while taking."""
        active = self._of_role(ACTIVE)
        self._retire([member for member in active if not member.state_port])
        self._hold([member for member in active if member.state_port])
        self._tell_failure_of_the_living([m for m in active if m.lost_step is not None])
        self._awaiting(1, lambda: self._complete_spare_set() is not None or not self._pending,
                       f"no complete warm spare set of {self.world_size} process(es)")
        spare_set = self._complete_spare_set()
        if spare_set is None:  # none complete and none on its way: no set can form
            raise CoordinatorGaveUp(f"warm: no warm spare set of {self.world_size} process(es) is left or can start "
                                    f"(nodes lost: {', '.join(sorted(self._lost_nodes())) or 'none'})")
        ranks = {member.slot % self.world_size: member for member in spare_set}
        spares = {m.slot: rank for rank, m in ranks.items()}
        source = max((m for m in self._of_role(SERVING) if m.held_step), default=None,
                     key=lambda m: (m.held_step or 0, -(m.rank or 0)))
        if source is None:
            self._send_plans(ranks, RESUME_CHECKPOINT, None, 0, spares=spares)
        else:
            self._send_plans(ranks, RESUME_PEER, source.rank, source.held_step or 0, spares=spares,
                             source_address=source.address, source_port=source.state_port)
        self._source = source
        self._replace_spares()

    def _hold(self, survivors: list[Member]) -> None:
        """Each survivor told to hold; those whose "held" comes within hold_s serve their state from
        now on. All of them stay until the next set formed: one that did not answer is no source,
        but it may share its launch with one that serves (a Chainer set is one ``mpiexec``)."""
        for member in survivors:
            try:
                member.line.send({"op": "hold"})
            except OSError:
                pass  # it died meanwhile: its end is (or was) told
        self._lock.wait_for(lambda: all(m.held_step is not None or m.role != ACTIVE for m in survivors),
                            timeout=self.timing.hold_s)
        for member in survivors:
            if member.role == ACTIVE:
                member.role = SERVING

    def _servers_to_retire(self) -> bool:
        """Survivors still serving while the set that took their state has formed."""
        return self._generation_formed and bool(self._of_role(SERVING))

    def _complete_spare_set(self) -> list[Member] | None:
        """The lowest spare set whose every process is warm and waiting, one clear of the nodes
        where this failure's ranks died first (a node that crashed: its spare members' connections
        may end seconds after the rank's)."""
        sets: dict[int, list[Member]] = {}
        for member in self._of_role(SPARE):
            sets.setdefault(self._set_of(member.slot), []).append(member)
        complete = sorted(number for number, members in sets.items() if len(members) == self.world_size)
        clear = [number for number in complete if not {m.node for m in sets[number]} & self._failed_nodes]
        chosen = next(iter(clear or complete), None)
        return sorted(sets[chosen], key=lambda m: m.slot) if chosen is not None else None

    def _retire(self, members: list[Member]) -> None:
        """These members leave the job for good (their connections' end is no news): the host ends them."""
        for member in members:
            member.role = RETIRED
        if members and self.end is not None:
            try:
                self.end([member.slot for member in members])
            except Exception as error:  # what cannot be ended now is ended with the job
                log.warning("ending slots %s failed: %s", [m.slot for m in members], error)

    def _break_set(self, number: int) -> None:
        """A spare set lost a member: the rest of it is retired, including those still starting."""
        self._broken_sets.add(number)
        self._pending -= {slot for slot in self._pending if self._set_of(slot) == number}
        self._retire([m for m in self._of_role(SPARE) if self._set_of(m.slot) == number])

    def _set_of(self, slot: int) -> int:
        return slot // self.world_size

    @property
    def _spare_unit(self) -> int:
        """Processes per spare: one, or a whole set (restart_all)."""
        return self.world_size if self.restart_all else 1

    def _send_plans(self, ranks: dict[int, Member], resume: str, source_rank: int | None, step: int,
                    spares: dict[int, int] | None = None, source_address: str = "", source_port: int = 0) -> None:
        """The next generation: the run's next attempt (fenced before anyone hears of it), its plans."""
        self._count_unformed()
        self.generation += 1
        attempt = self.first_attempt + self.generation
        if self.generation > 0:
            self.fence(attempt)
        master = ranks[0]
        for rank, member in ranks.items():
            member.role, member.rank, member.lost_step, member.held_step = ACTIVE, rank, None, None
        self._formed, self._generation_formed, self._failure_told, self._voided = set(), False, False, False
        now = time.time()
        join_timeout_s = self.timing.reform_s if self.generation > 0 else None
        if self.stores is not None:
            self.stores.close_before(self.generation)
            address, port = self.stores.address, self._open_store(self.generation)
        else:
            address, port = master.address, self.port_base + self.generation
        plans = {rank: Plan(self.generation, attempt, rank, self.world_size, address, port, resume, source_rank, step,
                            now, join_timeout_s, store_hosted=self.stores is not None,
                            source_address=source_address, source_port=source_port)
                 for rank in ranks}
        self._event({"event": EVENT_WARM_PLAN, "time": now, "generation": self.generation, "resume": resume,
                     "source_rank": source_rank, "step": step, "failed_at": self._failed_at,
                     "spares_used": {str(slot): rank for slot, rank in (spares or {}).items()},
                     "spares_warm_at": {str(slot): self.members[slot].warm_at for slot in (spares or {})},
                     "slots": {str(rank): member.slot for rank, member in ranks.items()}})
        self._failed_at = None
        self._failed_nodes = set()
        for rank, member in ranks.items():
            try:
                member.line.send({**plans[rank].message(),
                                  "proof": coordinator_proof(self.secret, member.nonce, member.slot)})
            except OSError:
                pass  # it died meanwhile: its connection's end starts the next re-formation

    def _count_unformed(self) -> None:
        """The job gives up after UNFORMED_GENERATIONS re-formations in a row that never formed (each
        one's failure told already): whatever voids them would void the next one too."""
        if self.generation < 0:
            return
        self._unformed_in_a_row = 0 if self._generation_formed else self._unformed_in_a_row + 1
        if self._unformed_in_a_row >= UNFORMED_GENERATIONS:
            raise CoordinatorGaveUp(f"warm: generations {self.generation - UNFORMED_GENERATIONS + 1} to {self.generation} "
                                    "did not form (each rendezvous failed or lost a member): the job gives up")

    def _event(self, event: dict[str, Any]) -> None:
        """An event of the current generation's attempt, with the node whose clock stamped it."""
        self.events(self.first_attempt + max(self.generation, 0), {**event, EVENT_STAMPED_ON: THIS_NODE})

    def _awaiting(self, spares: int, ready: Callable[[], bool], what: str) -> None:
        """A re-formation waits for ``spares`` spares (sets): those the job lacks (more deaths than
        spares) are started at once, the others are replaced after its plans (the recovery first)."""
        self._spares_awaited = spares
        try:
            self._replace_spares()
            self._wait(ready, self.timing.spare_s, what)
        finally:
            self._spares_awaited = None

    def _replace_spares(self) -> None:
        """Start spares until the job holds as many as it was given, or as a re-formation awaits
        (each in new slots; restart_all: whole sets). Those started but not yet connected count:
        they are on their way."""
        if self.spawn is None:
            return
        unit = self._spare_unit
        held = len(self._of_role(SPARE)) + len(self._pending)
        wanted = self.spares_wanted if self._spares_awaited is None else self._spares_awaited
        for _ in range(max(0, wanted - held // unit)):
            slot, self._next_slot = self._next_slot, self._next_slot + unit
            slots = set(range(slot, slot + unit))
            self._pending |= slots
            try:
                self.spawn(slot, self.first_attempt + max(self.generation, 0), self._placement())
            except Exception as error:  # none is on its way (a launch that fails later is waited for)
                self._pending -= slots
                log.warning("starting a warm spare as slot %d failed: %s", slot, error)

    def _placement(self) -> Placement:
        lost = self._lost_nodes()
        return Placement(node=None if self.restart_all else self._spare_node(), avoid=lost)

    def _lost_nodes(self) -> frozenset[str]:
        """Nodes where a member died and none is left alive (a node crash). Retired members say
        nothing either way (the job ended them): a node with only those is not lost by them."""
        alive = {m.node for m in self.members.values() if m.role in (ACTIVE, SPARE, DONE, SERVING)}
        died = {m.node for m in self.members.values() if m.role == GONE}
        return frozenset(died - alive)

    def _spare_node(self) -> str | None:
        """Where a new spare goes: the node with the fewest live members among those that still have
        one (a node whose members all died may be down)."""
        live: dict[str, int] = {}
        for member in self.members.values():
            if member.role in (ACTIVE, SPARE):
                live[member.node] = live.get(member.node, 0) + 1
        return min(live, key=lambda node: (live[node], node)) if live else None

    def _release_spares(self) -> None:
        with self._lock:
            self._released = True
            for member in self.members.values():
                if member.role == SPARE:
                    _let_go(member.line)

    # --- helpers ------------------------------------------------------------------------------------

    def _of_role(self, role: str) -> list[Member]:
        return [member for member in self.members.values() if member.role == role]

    def _active_slots(self) -> set[int]:
        return {member.slot for member in self._of_role(ACTIVE)}

    def _done(self) -> bool:
        done = self._of_role(DONE)
        return bool(done) and not self._of_role(ACTIVE) and len(done) >= 1 and self._failed_at is None

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        if not self._lock.wait_for(lambda: condition() or self._verdict is not None, timeout=timeout_s):
            raise CoordinatorGaveUp(f"warm: {what} within {timeout_s:g} s")
        self._check_aborted()

    def _check_aborted(self) -> None:
        if self._verdict is not None and self._verdict != "completed":
            raise CoordinatorGaveUp(f"warm: {self._verdict}")


def _member_of(hello: dict[str, Any] | None, line: Line) -> Member | None:
    if hello is None or hello.get("op") != "hello":
        return None
    slot, pid = hello["slot"], hello["pid"]
    if type(slot) is not int or type(pid) is not int:
        raise TypeError(f"slot {slot!r} and pid {pid!r} must be integers")
    state_port = hello.get("state_port", 0)
    if type(state_port) is not int or not 0 <= state_port < 65536:
        raise TypeError(f"state_port {state_port!r} must be a port number")
    return Member(slot=slot, node=str(hello["node"]), address=str(hello["address"]), pid=pid, line=line,
                  nonce=str(hello.get("nonce", "")), state_port=state_port)


def _step_of(message: dict[str, Any]) -> int:
    """The step a member's message names; MalformedMessage (the member's end) if it names none."""
    step = message.get("step")
    if type(step) is not int:
        raise MalformedMessage(f"{message.get('op')} without a step: {step!r}")
    return step


def _warn_accept(error: OSError) -> None:
    log.warning("warm: accepting a connection failed (%s): trying again", error)


def _let_go(line: Line) -> None:
    """The run is over for this process (a spare): it exits."""
    try:
        line.send({"op": "exit"})
    except OSError:
        pass


def _close_listener(listener: socket.socket) -> None:
    """Stop accepting. A bare close leaves a thread blocked in accept() listening on (Linux): the
    shutdown wakes it."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


def _keepalive(connection: socket.socket) -> None:
    """A member whose node died without a word (link down, then its processes killed) never closes
    its connection: the kernel's keepalive probes end it within ~4 s instead."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
