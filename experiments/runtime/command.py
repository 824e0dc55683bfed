"""A command workload's rank: the user's training script, started and watched by this process.

The rank task the launcher started (srun, mpiexec, the local executor) becomes a small supervisor:
it starts the script as its child with the drill's variables in its environment, registers the
child as the rank (the fault injector verifies and signals the child), passes the scheduler's
signals on, and ends the way the child ended (the same exit code, or the same signal), so that the
launcher, the batch script and the controller see what they would see of a built-in rank.

Progress comes from the script through the rank API (``progress: api``), or, for a script that
knows nothing of Faultdrill (zero-code mode), from its log lines (``progress: log``, a regex with
the step in group 1) or from the checkpoint files it writes (``progress: checkpoints``, a glob and
a regex on the names): the supervisor then writes the heartbeats and the timeline itself, marked
``inferred`` where it can only infer a moment (the load, the step resumed from).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from experiments.layout import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_PROCESS_STARTED_AT,
    ENV_RANK,
    ENV_RANK_JOB,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_WORLD_SIZE,
    EVENT_CHECKPOINT_LOADED,
    EVENT_COMPLETED,
    EVENT_ELASTIC_ROUND,
    EVENT_FIRST_STEP,
    EVENT_FRAMEWORK_READY,
    EVENT_PROCESS_START,
    EVENT_WARM_FAILURE,
    PROGRESS_API,
    PROGRESS_CHECKPOINTS,
    PROGRESS_LOG,
    CommandSpec,
    FinalRecord,
    RankIdentity,
    RankJob,
    RunPaths,
    fill_attempt,
    rank_job_to_dict,
    read_json_lines_backwards,
    record_dict,
    write_json_atomic,
)
from experiments.runtime.distenv import DistEnv, device_local_rank
from experiments.runtime.events import EventLog
from experiments.runtime.fence import Fence, StaleAttemptError, advance_fence, check_current, own_job_id, read_fence
from experiments.runtime.heartbeat import HeartbeatWriter
from experiments.runtime.identity import start_ticks
from experiments.runtime.processes import children_of
from experiments.runtime.torchrun import ELASTIC_ENV, WorkerRegistry, first_rank, root_cause_exit, torchrun_argv

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # the scheduler's warning (walltime near, preemption)
CHECKPOINT_SCAN_S = 0.5
ROUND_FENCE_WAIT_S = 10.0  # elastic: how long a node waits for the main node to fence torchrun's next round
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
REAP_S = 5.0
# After the script's end, its output is read to the end of the pipes (its last step lines are there:
# a pipe holds thousands) however far behind the reader is; a pipe still open with nothing read for
# this long is held by a process that escaped the script's group, and is left.
PIPE_QUIET_S = 5.0
TAIL_LINES = 20


class CommandFailed(RuntimeError):
    """The script could not be started, or ended without finishing the run: says why. ``exit_code``:
    the rank's exit code, the script's own when it exited non-zero (a wrapper's 137 stays 137: a
    child lost to SIGKILL, which the controller classes as a signal)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def child_environment(job: RankJob, env: DistEnv, started_at: float) -> dict[str, str]:
    """The script's environment: the rank's own, the drill's variables, the usual names PyTorch's
    ``env://`` rendezvous reads (unless the spec's env sets them), then the spec's env."""
    command = job.workload.command
    assert command is not None
    paths = RunPaths(Path(job.run_dir))
    drill = {
        ENV_RANK_JOB: json.dumps(rank_job_to_dict(job), sort_keys=True),
        ENV_RANK: str(env.rank), ENV_LOCAL_RANK: str(env.local_rank), ENV_WORLD_SIZE: str(env.world_size),
        ENV_ATTEMPT: str(job.attempt), ENV_CHECKPOINT_DIR: str(paths.checkpoints),
        ENV_RUN_DIR: str(paths.root), ENV_RUN_ID: job.run_id,
        ENV_MASTER_ADDR: env.master_addr, ENV_MASTER_PORT: str(env.master_port),
        ENV_PROCESS_STARTED_AT: repr(started_at),
    }
    # PYTHONUNBUFFERED: a Python script's step lines reach the supervisor as printed, not in 8 KB
    # blocks of a pipe (a step-anchored fault met the script steps late); the spec's env may say 0.
    # LOCAL_RANK: the GPU index a script gives set_device (the task's own GPUs only, under a per-task
    # binding); FAULTDRILL_LOCAL_RANK stays the task's place on its node.
    conventional = {"RANK": str(env.rank), "LOCAL_RANK": str(device_local_rank(os.environ, env.local_rank)),
                    "WORLD_SIZE": str(env.world_size),
                    "MASTER_ADDR": env.master_addr, "MASTER_PORT": str(env.master_port), "PYTHONUNBUFFERED": "1"}
    if command.torchrun:  # the task is the node's torchrun: it gives each worker its own place
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE):
            conventional.pop(name, None)
            drill.pop(name, None)
        if job.torchrun_restarts:
            conventional.update(ELASTIC_ENV)
    return {**os.environ, **conventional, **drill, **{name: fill_attempt(value, job.attempt) for name, value in command.env}}


def trained_before(paths: RunPaths, attempt: int) -> bool:
    """An earlier attempt of the run reported a step (so the script has something to resume): an
    attempt's steps only grow, so each earlier file's last line says."""
    reached = steps_reached_before(paths, attempt)
    return reached is not None and reached[1] > 0


def steps_reached_before(paths: RunPaths, attempt: int) -> tuple[int, int] | None:
    """(attempt, step): the furthest step an earlier attempt of the run reported, and which one did."""
    reached = [(next(read_json_lines_backwards(file), {}).get("step", 0), earlier)
               for earlier in paths.heartbeat_attempts() if earlier < attempt
               for file in paths.heartbeat_files(earlier)]
    if not reached:
        return None
    step, earlier = max(reached)
    return earlier, step


def command_argv(command: CommandSpec, paths: RunPaths, attempt: int) -> list[str]:
    argv = list(command.argv)
    if command.resume_args and trained_before(paths, attempt):
        argv += list(command.resume_args)
    return [fill_attempt(word, attempt) for word in argv]


@dataclass
class InferredProgress:
    """Zero-code mode: the script's steps as its logs or files show them, written as heartbeats
    and as the attempt's timeline (rank 0)."""

    job: RankJob
    events: EventLog
    heartbeat: HeartbeatWriter
    resumed_from: int | None = None  # from the script's own checkpoints, when it has some
    logged: bool = False  # steps come from the script's log lines (not from its checkpoint files)
    last_step: int = 0
    first_seen: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, step: int) -> None:
        with self.lock:
            if self.first_seen and step <= self.last_step:
                return
            if not self.first_seen:
                self._first(step)
            self.last_step = step
            self.heartbeat.beat(step, force=step >= self.job.workload.steps)

    def _first(self, step: int) -> None:
        self.first_seen = True
        resumed = self.resumed_from if self.resumed_from is not None else max(0, step - 1)
        extra: dict[str, Any] = {}
        if self.resumed_from and self.logged and step <= self.resumed_from:
            # Its first step logged is one its newest checkpoint file already holds: it loaded an
            # older file, or none. Its log is taken, and the difference named. (A later first step
            # is a script that logs every N steps: the file stands.)
            resumed = max(0, step - 1)
            extra["resume_mismatch"] = (f"its newest checkpoint file was step {self.resumed_from}, but its first "
                                        f"step logged was {step}: it resumed from step {resumed}")
        now = time.time()
        # The script says nothing of its set-up and load: start-up ends at the first step seen.
        self.events.emit(EVENT_FRAMEWORK_READY, when=now, inferred=True)
        self.events.emit(EVENT_CHECKPOINT_LOADED, when=now, step=resumed, load_s=0.0, inferred=True,
                         source="script's checkpoints" if self.resumed_from is not None else "first step logged",
                         **extra)
        self.events.emit(EVENT_FIRST_STEP, when=now, step=step, inferred=True)


def checkpoint_steps(run_cwd: Path, command: CommandSpec) -> list[int]:
    """The steps of the script's own checkpoint files (glob relative to its working directory)."""
    pattern = re.compile(command.checkpoint_step_regex)
    base = Path(command.checkpoint_glob)
    paths = base.parent.glob(base.name) if base.is_absolute() else run_cwd.glob(command.checkpoint_glob)
    steps = []
    for path in paths:
        match = pattern.search(path.name)
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps)


class Supervisor:
    def __init__(self, job: RankJob, env: DistEnv, started_at: float) -> None:
        assert job.workload.command is not None
        self.job, self.env, self.started_at = job, env, started_at
        self.command = job.workload.command
        self.paths = RunPaths(Path(job.run_dir))
        self.cwd = Path(fill_attempt(self.command.cwd, job.attempt)) if self.command.cwd else Path.cwd()
        self.attempt = job.attempt  # under elastic, torchrun's current round's (experiments/runtime/torchrun.py)
        self.events = EventLog(self.paths.supervisor_events_file(job.attempt), enabled=env.is_main)
        self.child: subprocess.Popen[bytes] | None = None
        self.stderr_tail: list[str] = []
        self.progress: InferredProgress | None = None
        self.known_checkpoints: set[int] = set()  # the script's checkpoint files seen so far
        self.workers: WorkerRegistry | None = None  # torchrun: its workers, the ranks
        self._stop = threading.Event()
        self.last_read = time.monotonic()  # when a reader of the script's pipes last got a line

    def run(self) -> dict[str, Any]:
        self._emit_start(self.started_at)
        if self.command.progress != PROGRESS_API:
            self.progress = self._inferred_progress()
        _adopt_orphans()
        child = self._start()
        self._register(child)
        watchers = self._watch(child)
        # The script's end, seen without reaping it: while its zombie stands, its pid (the group's
        # id) is nobody else's. What it started and left behind (a wrapper's trainer, a launcher's
        # workers) ends with it: nothing of the rank trains on beside the next attempt.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        end_group_and_orphans(child.pid)
        returncode = child.wait()
        self._stop.set()
        if self.workers is not None:
            self.workers.stop()
        self._drain(watchers)
        if self.command.progress == PROGRESS_CHECKPOINTS:
            self._scan_once()  # the last files, written after the last look
        return self._end(returncode)

    def _drain(self, watchers: list[threading.Thread]) -> None:
        """Wait for the readers of the script's pipes to reach their end, for as long as they read."""
        started = time.monotonic()
        for watcher in watchers:
            while watcher.is_alive() and time.monotonic() - max(self.last_read, started) < PIPE_QUIET_S:
                watcher.join(timeout=0.1)

    def _emit_start(self, when: float, **extra: Any) -> None:
        self.events.emit(EVENT_PROCESS_START, when=when, pid=os.getpid(), world_size=self.env.world_size,
                         num_nodes=self.env.num_nodes, scheduler=self.env.scheduler, job_id=self.env.job_id,
                         node=self.env.node, command=self.command.argv[0], progress=self.command.progress, **extra)

    def _inferred_progress(self) -> InferredProgress:
        # torchrun: the node's workers print into one pipe; its first worker's rank stands for them.
        rank = first_rank(self.command, self.env) if self.command.torchrun else self.env.rank
        heartbeat = HeartbeatWriter(self.paths.heartbeat_file(self.attempt, rank), self.attempt,
                                    self.job.heartbeat_interval_s, fault_steps=self.job.fault_steps)
        resumed_from = None
        if self.command.checkpoint_glob:
            steps = checkpoint_steps(self.cwd, self.command)
            resumed_from = steps[-1] if steps else 0
            self.known_checkpoints = set(steps)
        return InferredProgress(self.job, self.events, heartbeat, resumed_from,
                                logged=self.command.progress == PROGRESS_LOG)

    def _start(self) -> subprocess.Popen[bytes]:
        argv = command_argv(self.command, self.paths, self.job.attempt)
        if self.command.torchrun:
            argv = torchrun_argv(self.command, self.env, self.job.run_id, self.job.attempt, argv,
                                 restarts=self.job.torchrun_restarts)
        if self.cwd.is_relative_to(self.paths.root):  # the run's own (the default): made on first use
            self.cwd.mkdir(parents=True, exist_ok=True)
        if not self.cwd.is_dir():
            raise CommandFailed(f"workload.cwd: {str(self.cwd)!r} is not a directory on {os.uname().nodename}")
        piped = subprocess.PIPE if self.command.progress == PROGRESS_LOG else None
        try:
            # A process group of its own: signals (the scheduler's, passed on; a fault's) reach
            # everything the script starts, not only a wrapper or a launcher in front of the trainer.
            child = subprocess.Popen(argv, cwd=self.cwd, env=child_environment(self.job, self.env, self.started_at),
                                     stdout=piped, stderr=subprocess.PIPE, preexec_fn=_die_with_parent,
                                     process_group=0)
        except FileNotFoundError as error:
            raise CommandFailed(f"workload.command: {argv[0]!r} not found (cwd {self.cwd}): {error.strerror}; "
                                "give a path or a program on the ranks' PATH") from None
        except PermissionError as error:
            raise CommandFailed(f"workload.command: {argv[0]!r} cannot be run: {error.strerror}") from None
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self._forward)
        self.child = child
        return child

    def _forward(self, signum: int, frame: Any) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        if self.workers is not None and signum in WARNING_SIGNALS:
            # The scheduler's warning is for the workers: torchrun does not handle it (it would die
            # of it), and each worker leads a session of its own.
            for pid in self.workers.worker_pids():
                signal_group(pid, signum)
            return
        signal_group(self.child.pid, signum)

    def _register(self, child: subprocess.Popen[bytes]) -> None:
        """The child is the rank the fault injector acts on (its pid and kernel start time); under
        torchrun, each worker it starts is (registered as it appears)."""
        if self.command.torchrun:
            self.workers = WorkerRegistry(self.paths, self.env, self.command, self.job.attempt, self.job.run_id,
                                          child.pid, elastic=self.job.torchrun_restarts > 0, on_round=self._next_round)
            self.workers.start()
            return
        ticks = start_ticks(child.pid)
        identity = RankIdentity(rank=self.env.rank, pid=child.pid, create_time=time.time(), start_ticks=ticks or 0,
                                host=os.uname().nodename, node=self.env.node, job_id=own_job_id(self.env.job_id),
                                attempt=self.job.attempt, group=True, supervisor_pid=os.getpid(),
                                supervisor_start_ticks=start_ticks(os.getpid()))
        write_json_atomic(self.paths.rank_file(self.job.attempt, self.env.rank), record_dict(identity))

    def _next_round(self, round_: int, lost_rank: int, lost_at: float) -> bool:
        """restart.strategy elastic: torchrun started its workers again after one of ``lost_rank``'s
        round was gone at ``lost_at``. The round before failed (told in its events: the controller
        follows, as it follows warm's coordinator); this round is the next attempt, once the fence
        names it (unless the controller moved the run on: False, this node's workers are ended):
        its start, progress and heartbeats under it."""
        try:
            return self._take_round(round_, lost_rank, lost_at)
        except Exception as error:  # noqa: BLE001  # a round that cannot be taken is not trained on unwatched
            print(f"faultdrill: torchrun's round {round_} could not be taken ({type(error).__name__}: {error}); "
                  "ending torchrun", file=sys.stderr, flush=True)
            if self.child is not None:
                signal_group(self.child.pid, signal.SIGTERM)
            return False

    def _take_round(self, round_: int, lost_rank: int, lost_at: float) -> bool:
        failed, attempt = self.attempt, self.job.attempt + round_
        what = (f"torchrun's round {round_ - 1} of workers ended (rank {lost_rank}, on {self.env.node}, the first "
                "of this node's seen gone) and torchrun started them again")
        self.events.emit(EVENT_WARM_FAILURE, when=lost_at, rank=lost_rank, exit_code=-1, node=self.env.node,
                         elastic_round=round_ - 1, what=what)
        if not self._round_fenced(failed, attempt):
            return False
        self.attempt = attempt
        self.events = EventLog(self.paths.supervisor_events_file(attempt), enabled=self.env.is_main)
        now = time.time()
        self.events.emit(EVENT_ELASTIC_ROUND, when=now, round=round_, resume="the script's own checkpoint")
        self._emit_start(now, elastic_round=round_)
        if self.progress is not None:
            self.progress = self._inferred_progress()
        return True

    def _round_fenced(self, failed: int, attempt: int) -> bool:
        """The main node moves the run's fence from the failed round's attempt to this one's (only
        while it names the failed one); the others wait for it to (ROUND_FENCE_WAIT_S). False, and
        this node's torchrun ended, when the controller moved the run on."""
        job, drill = own_job_id(self.env.job_id), self.job.drill_id or None
        try:
            if self.env.is_main:
                advance_fence(self.paths, Fence(failed, job, drill), Fence(attempt, job, drill))
            else:
                self._await_fence(attempt, job, drill)
        except StaleAttemptError as error:
            print(f"faultdrill: torchrun's round {attempt - self.job.attempt} is not the run's: {error}",
                  file=sys.stderr, flush=True)
            if self.child is not None:
                signal_group(self.child.pid, signal.SIGTERM)
            return False
        return True

    def _await_fence(self, attempt: int, job: str, drill: str | None) -> None:
        """Until the fence names ``attempt`` of this very job: a fence with no job yet is the
        controller submitting the next attempt, not the main node's move."""
        deadline = time.monotonic() + ROUND_FENCE_WAIT_S
        while True:
            try:
                check_current(self.paths, attempt, job, "starting torchrun's next round", drill_id=drill)
                fence = read_fence(self.paths)
                if fence is None or fence.job_id is None:
                    raise StaleAttemptError(f"faultdrill: stale attempt: the fence names attempt {attempt} with no job "
                                            f"yet (the controller is submitting it), not job {job}'s next round")
                return
            except StaleAttemptError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _watch(self, child: subprocess.Popen[bytes]) -> list[threading.Thread]:
        watchers = [self._thread(self._pump, child.stderr, sys.stderr, True)]
        if child.stdout is not None:
            watchers.append(self._thread(self._pump, child.stdout, sys.stdout, False))
        if self.command.progress == PROGRESS_CHECKPOINTS:
            watchers.append(self._thread(self._scan_checkpoints))
        return watchers

    @staticmethod
    def _thread(target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        return thread

    def _pump(self, source: IO[bytes], target: Any, is_stderr: bool) -> None:
        """Pass the script's output on line by line; a matching line is a step (log mode)."""
        pattern = re.compile(self.command.step_regex) if self.command.progress == PROGRESS_LOG else None
        for raw in iter(source.readline, b""):
            self.last_read = time.monotonic()
            line = raw.decode(errors="replace")
            target.write(line)
            target.flush()
            if is_stderr:
                self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-TAIL_LINES:]
            if pattern is not None and self.progress is not None and (match := pattern.search(line)):
                self.progress.saw(int(match.group(1)))

    def _scan_checkpoints(self) -> None:
        while not self._stop.wait(CHECKPOINT_SCAN_S):
            self._scan_once()

    def _scan_once(self) -> None:
        """Steps of checkpoint files that appeared since the last look."""
        assert self.progress is not None
        for step in checkpoint_steps(self.cwd, self.command):
            if step not in self.known_checkpoints:
                self.known_checkpoints.add(step)
                self.progress.saw(step)

    def _end(self, returncode: int) -> dict[str, Any]:
        if self.workers is not None and self.workers.misplaced:  # it ended torchrun itself: no drill here
            raise CommandFailed(self.workers.misplaced)
        if returncode < 0:
            die_of(signal.Signals(-returncode))
        if returncode != 0 and self.command.torchrun and (worker_exit := root_cause_exit(self.stderr_tail)):
            returncode = worker_exit  # torchrun's 1 stands for its first failed worker's end: the rank's
            if returncode < 0:
                die_of(signal.Signals(-returncode))
        if returncode != 0:
            tail = "; ".join(line for line in self.stderr_tail[-3:] if line)
            raise CommandFailed(f"the script exited with code {returncode}" + (f": {tail}" if tail else ""),
                                exit_code=returncode)
        if self.progress is not None:
            self._finish_inferred()
        elif self.env.is_main and not self._final_written():
            raise CommandFailed("the script exited 0 without calling rank.done(): the run did not record its end")
        return {"rank": self.env.rank, "exit_code": 0}

    def _final_written(self) -> bool:
        try:
            return int(json.loads(self.paths.final.read_text()).get("attempt", -1)) == self.attempt
        except (OSError, ValueError):
            return False

    def _finish_inferred(self) -> None:
        assert self.progress is not None
        if not self.env.is_main:
            return  # scripts commonly log on rank 0 only: rank 0's account of the run is the one read
        steps = self.job.workload.steps
        last_step, note = self.progress.last_step, ""
        if last_step < steps and (reached := steps_reached_before(self.paths, self.attempt)) is not None:
            # A restart that found the final checkpoint runs no step and exits 0 (every framework's
            # resume does): the run was complete before, when the kill came.
            if reached[1] >= steps:
                last_step, note = reached[1], f"trained to its last step in attempt {reached[0]}; this one ran none"
        if last_step < steps:
            raise CommandFailed(f"the script exited 0 at step {last_step} of {steps} (as its "
                                f"{'logs' if self.command.progress == PROGRESS_LOG else 'checkpoints'} show): "
                                "the run did not reach its last step")
        check_current(self.paths, self.attempt, own_job_id(self.env.job_id), "writing the final record",
                      drill_id=self.job.drill_id or None)
        record = FinalRecord(step=last_step, digest="", time=time.time(), attempt=self.attempt,
                             drill_id=self.job.drill_id)
        write_json_atomic(self.paths.final, record_dict(record))
        extra: dict[str, Any] = {"note": note} if note else {}
        self.events.emit(EVENT_COMPLETED, step=last_step, digest="", inferred=True, **extra)


def signal_group(leader: int, signum: int) -> None:
    """``signum`` to the process group ``leader`` leads (to it alone if it left the group)."""
    try:
        if os.getpgid(leader) == leader:
            os.killpg(leader, signum)
        else:
            os.kill(leader, signum)
    except ProcessLookupError:
        pass


def _adopt_orphans() -> None:
    """The script's processes whose parent dies (a wrapper's trainer) become this process's
    children, not init's: ``end_group_and_orphans`` finds them even if they left the group."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # best effort: without it, the group alone is ended


def end_group_and_orphans(leader: int) -> None:
    """SIGKILL to what is left of the script's process group (``leader``, exited but not reaped)
    and to every process re-parented to this one (its own children only: their parent is this
    process, which nobody else can claim), again as long as new ones come (a process that left the
    group is re-parented here only once its parent has died); the dead reaped, ``leader`` left to
    its caller."""
    deadline = time.monotonic() + REAP_S  # a process in uninterruptible sleep dies when it wakes: not waited for
    while time.monotonic() < deadline:
        try:
            os.killpg(leader, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        others = [pid for pid in children_of(os.getpid()) if pid != leader]
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # gone; or it changed its uid (sudo): not ours to end
                pass
        _reap_all_but(leader)
        if not others and not _group_alive(leader):
            return
        time.sleep(0.01)


def _reap_all_but(leader: int) -> None:
    """Reap this process's dead children (re-parented orphans), never ``leader`` (its caller's)."""
    for pid in children_of(os.getpid(), zombies=True):
        if pid != leader:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _group_alive(leader: int) -> bool:
    """A member of the group besides its (exited) leader still runs."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != leader:
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
            if len(fields) > 2 and int(fields[2]) == leader and fields[0] != "Z":
                return True
    return False


def _die_with_parent() -> None:
    """In the child, before the script runs: the kernel kills it when the supervisor dies (a job
    cancelled by SIGKILL must not leave a script behind, least of all one a hang fault stopped)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def die_of(signum: signal.Signals) -> None:
    """End this process by ``signum`` (as the child did), so the launcher sees what it would see of
    a built-in rank: a signal, not an exit code."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signum)
    time.sleep(5)  # a signal whose default is to go on (SIGCHLD, SIGURG): exit as a shell would
    os._exit(128 + signum)


def run_command(job: RankJob, env: DistEnv, started_at: float) -> dict[str, Any]:
    return Supervisor(job, env, started_at).run()
