"""The shared vocabulary between the login node (orchestrator) and the compute side.

Everything both sides must agree on lives here and nowhere else: where a run keeps its files,
the names of the environment variables Faultdrill sets, and the records written to disk.
The compute side never imports ``orchestrator``; the orchestrator imports this module.
"""

from __future__ import annotations

import heapq
import json
import os
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, TypeVar

if TYPE_CHECKING:  # the controller's alone: ranks (the rank API's wheel, on other Pythons) never import it
    from experiments.file_changes import FileChanges

# Environment variables Faultdrill sets for the ranks of a job (in the batch script / executor).
ENV_RUN_DIR = "FAULTDRILL_RUN_DIR"
ENV_RUN_ID = "FAULTDRILL_RUN_ID"
ENV_ATTEMPT = "FAULTDRILL_ATTEMPT"
ENV_DRILL_ID = "FAULTDRILL_DRILL_ID"
ENV_JOB_ID = "FAULTDRILL_JOB_ID"  # the job as the controller names it (set by the batch script)
# Optional overrides read by the ranks (experiments.runtime.distenv / the workloads).
ENV_MASTER_ADDR = "FAULTDRILL_MASTER_ADDR"  # rendezvous host; default: first node of the job
ENV_MASTER_PORT = "FAULTDRILL_MASTER_PORT"  # rendezvous port; default: derived from the job id
# Comma-separated host of every rank, in rank order, from the launch that placed them (the PBS
# batch script's mpiexec --map-by ppr:M:node): wins over the scheduler's variables.
ENV_RANK_HOSTS = "FAULTDRILL_RANK_HOSTS"
ENV_COLLECTIVE_TIMEOUT_S = "FAULTDRILL_COLLECTIVE_TIMEOUT_S"  # how long a rank waits on a dead peer
ENV_RENDEZVOUS_TIMEOUT_S = "FAULTDRILL_RENDEZVOUS_TIMEOUT_S"  # how long rank 0 waits for late ranks
ENV_CHECKPOINT_TIMEOUT_S = "FAULTDRILL_CHECKPOINT_TIMEOUT_S"  # how long ranks wait for a checkpoint write
ENV_ASYNC_PERSIST = "FAULTDRILL_ASYNC_PERSIST"  # "0": rank 0 hashes and publishes before training goes on
# What a command workload's script is started with (experiments/runtime/command.py), besides the
# above and the launcher's own: the rank API (experiments/runtime/api.py) reads the job file.
ENV_RANK_JOB = "FAULTDRILL_RANK_JOB"  # the RankJob of this attempt as JSON (rank_job_to_dict)
ENV_RANK = "FAULTDRILL_RANK"
ENV_LOCAL_RANK = "FAULTDRILL_LOCAL_RANK"
ENV_WORLD_SIZE = "FAULTDRILL_WORLD_SIZE"
ENV_CHECKPOINT_DIR = "FAULTDRILL_CHECKPOINT_DIR"  # the run's checkpoint store (the API writes into it)
ENV_PROCESS_STARTED_AT = "FAULTDRILL_PROCESS_STARTED_AT"  # set by the command supervisor: when the rank started
# The walltime warning (experiments/runtime/warning.py): which signal the ranks get, how long they hold.
ENV_WARNING_SIGNAL = "FAULTDRILL_WARNING_SIGNAL"
ENV_WARNING_HOLD_S = "FAULTDRILL_WARNING_HOLD_S"
# restart.strategy warm (experiments/warm/protocol.py): what a job's members are started with.
ENV_WARM_WORLD = "FAULTDRILL_WARM_WORLD"  # the run's ranks (the job's tasks are these and the spares)
ENV_WARM_SPARES = "FAULTDRILL_WARM_SPARES"  # the warm spares the job holds beside them
ENV_WARM_COORDINATOR = "FAULTDRILL_WARM_COORDINATOR"  # host:port of the job's coordinator
ENV_WARM_SLOT = "FAULTDRILL_WARM_SLOT"  # a spare started later: its slot (the launcher's tasks: their task id)
ENV_WARM_ADDRESS = "FAULTDRILL_WARM_ADDRESS"  # the address this member may host a rendezvous on
ENV_WARM_SECRET = "FAULTDRILL_WARM_SECRET"  # the job's warm channel secret (hex): a member proves it in its hello
# TensorFlow, Chainer: "1" when every rank restarts in a warm spare set (their collectives cannot
# drop a member); the job's spares (ENV_WARM_SPARES) are then whole sets, launched set by set.
ENV_WARM_RESTART_ALL = "FAULTDRILL_WARM_RESTART_ALL"
ENV_WARM_SET = "FAULTDRILL_WARM_SET"  # restart-all: the set this process belongs to (its slot: set * world + rank)

# Settings read on the login side and in the local backend's job (not set for the ranks).
ENV_PBS_SERVER = "FAULTDRILL_PBS_SERVER"  # torque | pro | slurm-wrappers: skips detection
ENV_PBS_AGENT_LAUNCH = "FAULTDRILL_PBS_AGENT_LAUNCH"  # auto | ssh | srun
ENV_RELAUNCH_WAIT_S = "FAULTDRILL_RELAUNCH_WAIT_S"  # local in-allocation: how long a relaunch waits for its go
# What the project's cluster script (scripts/cluster) records of the cluster it made, in cluster.env.
CLUSTER_NODES_KEY = "FAULTDRILL_CLUSTER_NODES"
CLUSTER_NAME_KEY = "FAULTDRILL_CLUSTER_NAME"

SIGNAL_EXIT_BASE = 128  # srun and shells: a task killed by signal N exits 128 + N
# What PyTorch's NCCL process group says on a rank whose peer died or hung (its watchdog's timeout,
# NCCL's remote error, an abort after another rank's): a consequence, not the rank's own cause.
NCCL_PEER_LOSS_MARKERS = ("Watchdog caught collective operation timeout", "ncclRemoteError",
                          "remote process exited or there was a network error", "communicator was aborted")

MANIFEST_NAME = "manifest.json"
# An attempt's timeline, in its attempt folder: one file per writer (appends from several hosts to
# one file interleave and, over NFS, are not atomic), read back merged (read_attempt_events).
EVENTS_FILE_NAME = "events.jsonl"  # rank 0's (the rank runtime: first step, checkpoints, the end)
SCRIPT_EVENTS_FILE_NAME = "script-events.jsonl"  # the batch script's (the job's start, the launch's exit)
COORDINATOR_EVENTS_FILE_NAME = "coordinator-events.jsonl"  # the warm coordinator's (a re-formed world)
# A command workload's supervisor's (its start; what it infers of the script's progress; torchrun's rounds)
SUPERVISOR_EVENTS_FILE_NAME = "supervisor-events.jsonl"
EVENT_FILE_NAMES = (SCRIPT_EVENTS_FILE_NAME, SUPERVISOR_EVENTS_FILE_NAME, EVENTS_FILE_NAME, COORDINATOR_EVENTS_FILE_NAME)
CLOCKS_FILE_NAME = "clocks.json"  # the controller's readings of an attempt's nodes' clocks
RELAUNCH_EXCLUDE_NAME = "relaunch-exclude"  # in-allocation: the nodes an attempt's rank step stays off
RANK_STEP_NAME = "faultdrill-ranks"  # the in-allocation rank step's name (srun --job-name), then -<attempt>
AGENT_STEP_NAME = "faultdrill-agent"  # a step the login side starts in a job (a fault's agent, a clock reading)
CHECKPOINT_PREFIX = "step-"


# How a command workload reports its progress: through the rank API, or (zero-code mode) from its
# log lines or from the checkpoint files it writes itself.
PROGRESS_API = "api"
PROGRESS_LOG = "log"
PROGRESS_CHECKPOINTS = "checkpoints"


# {attempt} in a command workload's argv, env or cwd: the orchestrator fills every other placeholder
# per run and leaves this mark; the rank puts the attempt's number in when the attempt starts.
ATTEMPT_MARK = "\x1fattempt\x1f"  # no spec text holds it: a control character


def fill_attempt(text: str, attempt: int) -> str:
    """``text`` as the orchestrator filled it, with this attempt's number for {attempt}."""
    return text.replace(ATTEMPT_MARK, str(attempt))


@dataclass(frozen=True)
class CommandSpec:
    """The user's training script as the ranks (placeholders already filled in by the orchestrator)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""  # "" : the directory the rank starts in
    progress: str = PROGRESS_API
    # PROGRESS_LOG: a line of the script's stdout or stderr that matches holds the step in group 1.
    step_regex: str = ""
    # PROGRESS_CHECKPOINTS: the files the script writes (a glob) and the step in their names (group 1).
    checkpoint_glob: str = ""
    checkpoint_step_regex: str = ""
    # Appended to argv when the run has trained before (zero-code: the script resumes itself).
    resume_args: tuple[str, ...] = ()
    # workload.launcher torchrun: torchrun's program and the user's own options of it; argv is then
    # what torchrun runs on each worker, and the ranks are its workers (experiments/runtime/torchrun.py).
    torchrun: tuple[str, ...] = ()
    torchrun_ranks: int = 0  # the run's ranks: each node's torchrun starts its share of them


@dataclass(frozen=True)
class WorkloadSpec:
    """What a rank trains: identical for every framework so that runs compare.

    ``command`` set: the user's script trains (``steps`` is the step it trains to); ``model``,
    ``params`` and ``batch_size`` are the built-in workloads'.
    """

    framework: str = "torch"
    model: str = "mlp"
    params: int = 100_000
    steps: int = 200
    seed: int = 0
    batch_size: int = 32
    step_s: float = 0.0  # the built-in workloads' least step time (workload.step_s)
    command: CommandSpec | None = None


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs to run one attempt of one run; pickled by submitit."""

    run_id: str
    run_dir: str
    attempt: int
    workload: WorkloadSpec
    checkpoint_every: int
    checkpoint_keep: int
    heartbeat_interval_s: float = 0.05
    drill_id: str = ""
    keep_final_weights: bool = False
    exclude_nodes: tuple[str, ...] = ()  # nodes this attempt is kept off (restart.policy exclude_node)
    fault_steps: tuple[int, ...] = ()  # the steps at_step faults name: heartbeats written at once there
    # restart.strategy elastic: torchrun's --max-restarts; each round of its workers is attempt + round
    torchrun_restarts: int = 0


@dataclass(frozen=True)
class RunPaths:
    """The files of one run (all attempts share them; the run directory is on shared storage)."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def script_cwd(self) -> Path:
        """A command workload's working directory unless its spec names one: the run's own, kept
        across its attempts (what the script writes to relative paths is this run's alone)."""
        return self.root / "work"

    @property
    def checkpoint_log(self) -> Path:
        """Append-only: one CheckpointRecord per checkpoint ever written (pruning never touches it)."""
        return self.root / "checkpoints.jsonl"

    @property
    def current_attempt(self) -> Path:
        """The fence: which attempt (and job) may run now (experiments.runtime.fence)."""
        return self.root / "current-attempt"

    @property
    def quarantine(self) -> Path:
        """Checkpoints taken out of the choice (unreadable, corrupt, failed to load): never deleted.
        Inside the checkpoint directory, so on its filesystem (scratch, when the run directory is in
        home): moving a checkpoint aside is one rename, never a copy across filesystems (EXDEV)."""
        return self.checkpoints / "quarantine"

    @property
    def checkpoint_rejections(self) -> Path:
        """Append-only: checkpoints a rank failed to load ({step, written_by, attempt, rank, error})."""
        return self.root / "checkpoint-rejections.jsonl"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat_file(self, attempt: int, rank: int) -> Path:
        """A file per attempt and rank: a new attempt's watch reads its own attempt's lines, never
        the run's whole history."""
        return self.heartbeats / str(attempt) / f"rank-{rank}.jsonl"

    def heartbeat_files(self, attempt: int) -> list[Path]:
        """Every rank's heartbeat file of ``attempt`` that exists."""
        return sorted(self.heartbeat_file(attempt, 0).parent.glob("rank-*.jsonl"))

    def heartbeat_attempts(self) -> list[int]:
        """The attempts that wrote heartbeats, oldest first."""
        if not self.heartbeats.is_dir():
            return []
        return sorted(int(path.name) for path in self.heartbeats.iterdir() if path.name.isdigit())

    @property
    def loss_log(self) -> Path:
        return self.root / "loss.jsonl"

    def attempt_dir(self, attempt: int) -> Path:
        return self.root / "attempts" / str(attempt)

    def events_file(self, attempt: int) -> Path:
        """Rank 0's timeline of one attempt (one JSON object a line), written by rank 0 alone."""
        return self.attempt_dir(attempt) / EVENTS_FILE_NAME

    def script_events_file(self, attempt: int) -> Path:
        """The batch script's events of one attempt (the local backend's stand-in for it), its alone."""
        return self.attempt_dir(attempt) / SCRIPT_EVENTS_FILE_NAME

    def coordinator_events_file(self, attempt: int) -> Path:
        """The warm coordinator's events of one attempt, its alone."""
        return self.attempt_dir(attempt) / COORDINATOR_EVENTS_FILE_NAME

    def supervisor_events_file(self, attempt: int) -> Path:
        """A command workload's supervisor's events of one attempt (rank 0's node's), its alone: the
        script writes rank 0's own through the rank API (``progress: api``)."""
        return self.attempt_dir(attempt) / SUPERVISOR_EVENTS_FILE_NAME

    def event_files(self, attempt: int, writers: tuple[str, ...] | None = None) -> tuple[Path, ...]:
        """Every writer's events file of one attempt (read back merged: read_attempt_events), or
        those of ``writers`` (their files' names: EVENT_FILE_NAMES)."""
        directory = self.attempt_dir(attempt)
        return tuple(directory / name for name in (EVENT_FILE_NAMES if writers is None else writers))

    def clocks_file(self, attempt: int) -> Path:
        """The clock of each of ``attempt``'s nodes against the login node's (orchestrator.record.clocks),
        written by the controller alone."""
        return self.attempt_dir(attempt) / CLOCKS_FILE_NAME

    def relaunch_exclude_file(self, attempt: int) -> Path:
        """in-allocation: the nodes ``attempt``'s rank step stays off (written by the controller)."""
        return self.attempt_dir(attempt) / RELAUNCH_EXCLUDE_NAME

    def rank_error_file(self, attempt: int, rank: int) -> Path:
        """Why rank ``rank`` of ``attempt`` failed (the exception it died of), if it could say."""
        return self.attempt_dir(attempt) / f"rank-{rank}-error.json"

    def fault_request_file(self, attempt: int, rank: int) -> Path:
        """What the fault agent asks rank ``rank`` of ``attempt`` to act out (experiments/runtime/fault_requests)."""
        return self.attempt_dir(attempt) / f"rank-{rank}-fault-request.json"

    def rank_file(self, attempt: int, rank: int) -> Path:
        """Who rank ``rank`` of ``attempt`` is (pid, host, job id): read by the fault injector."""
        return self.attempt_dir(attempt) / f"rank-{rank}.json"

    @property
    def final(self) -> Path:
        return self.root / "final.json"

    @property
    def final_weights(self) -> Path:
        """The final weights as named arrays (.npz), kept when the run has a baseline to compare to."""
        return self.root / "final-weights.npz"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"


@dataclass(frozen=True)
class Heartbeat:
    attempt: int
    step: int
    time: float
    # Set while the rank is in a long phase (resume, checkpoint, finish): the controller then
    # allows ``timeout_s`` of silence instead of its hang timeout (a phase marker with its own timeout).
    phase: str | None = None
    timeout_s: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Heartbeat":
        """A heartbeat line read back (a field the writer left out is None)."""
        timeout_s = data.get("timeout_s")
        return cls(attempt=int(data["attempt"]), step=int(data["step"]), time=float(data["time"]),
                   phase=data.get("phase"), timeout_s=float(timeout_s) if timeout_s is not None else None)


@dataclass(frozen=True)
class EventRecord:
    """One line of an attempt's events.jsonl read back: its name, its time and what else it says."""

    name: str
    time: float
    fields: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EventRecord":
        return cls(name=str(data.get("event", "")), time=float(data.get("time", 0.0)), fields=data)

    def number(self, key: str, default: float) -> float:
        """A numeric field of the event, ``default`` when it is absent or null."""
        value = self.fields.get(key)
        return float(value) if value is not None else default


def read_events(path: Path) -> list[EventRecord]:
    """One writer's events file read back, in the order they were written."""
    return [EventRecord.from_json(record) for record in read_json_lines(path)]


def read_attempt_events(paths: "RunPaths", attempt: int) -> list[EventRecord]:
    """Every writer's events of ``attempt``, merged in time order (each writer's own order kept)."""
    return by_time([read_events(path) for path in paths.event_files(attempt)])


def attempt_event_lines(paths: "RunPaths", attempt: int) -> list[dict[str, Any]]:
    """``read_attempt_events`` as the JSON objects written."""
    return [event.fields for event in read_attempt_events(paths, attempt)]


def by_time(writers: list[list[EventRecord]]) -> list[EventRecord]:
    """Several writers' events, each writer's as written, interleaved by time (a writer may stamp an
    event with an earlier moment than one it wrote before: its order stands). Where one writer
    wrote (a round's usual case: a watch reads four writers' files, most of them with nothing new),
    its list as it is, no merge."""
    written = [events for events in writers if events]
    if len(written) <= 1:
        return list(written[0]) if written else []
    return list(heapq.merge(*written, key=lambda event: event.time))


def first_event(events: list[EventRecord], name: str) -> EventRecord | None:
    return next((event for event in events if event.name == name), None)


@dataclass(frozen=True)
class RankError:
    """What a rank died of (its rank-<r>-error.json), for the ledger's reason."""

    rank: int
    time: float
    error: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RankError":
        return cls(rank=int(data["rank"]), time=float(data.get("time", 0.0)), error=str(data.get("error", "")))


@dataclass(frozen=True)
class LossRecord:
    """One line of the run's loss log: rank 0's loss at ``step`` of ``attempt``."""

    attempt: int
    step: int
    loss: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LossRecord":
        return cls(attempt=int(data["attempt"]), step=int(data["step"]), loss=float(data["loss"]))


@dataclass(frozen=True)
class RankIdentity:
    """Written by each rank at start so an injector can verify a target before it acts."""

    rank: int
    pid: int
    create_time: float  # for people; the check uses start_ticks (see experiments/runtime/identity.py)
    host: str
    node: str
    job_id: str
    attempt: int
    start_ticks: int = 0  # /proc/<pid>/stat field 22
    # The rank leads a process group of its own (a user's script behind a wrapper or a launcher that
    # forks): a fault's signal goes to the whole group, so it reaches the trainer, not only the wrapper.
    group: bool = False
    # A warm process that left this attempt (its generation ended; it waits for, or serves, the
    # next): when. A fault still aimed at this attempt must not reach the process (experiments/
    # runtime/identity.leave_attempt).
    left_at: float | None = None
    # The launcher that started this rank on its node (torchrun's agent), when the rank is not the
    # process the scheduler started: a fault may aim at it (kill-rank process: launcher).
    launcher_pid: int | None = None
    launcher_start_ticks: int | None = None
    # The command workload's supervisor that started this rank (its parent, Faultdrill's runtime):
    # where the rank's own environment cannot be read (a setuid container starter: apptainer,
    # singularity), the rank is verified as the supervisor's child and the supervisor as the drill's.
    supervisor_pid: int | None = None
    supervisor_start_ticks: int | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    """One line of the checkpoint log; the manifest in the checkpoint directory holds the same."""

    step: int
    attempt: int
    path: str
    time: float
    bytes: int
    files: dict[str, str] = field(default_factory=dict)  # file name -> its hash (hash_algorithm's)
    framework: str = ""
    format: str = ""
    writers: str = ""  # "rank0" or "all"
    blocking_s: float = 0.0
    persist_s: float = 0.0
    hash_algorithm: str = "sha256"  # experiments.runtime.integrity (a record without one: sha256)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckpointRecord":
        """A checkpoint log line read back (fields a newer writer added are left out)."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


@dataclass(frozen=True)
class FinalRecord:
    step: int
    digest: str
    time: float
    attempt: int
    drill_id: str = ""  # the drill whose rank wrote it ("" in records older than the field)


# Event names in an attempt's events.jsonl, in the order they happen.
EVENT_STAMPED_ON = "stamped_on"  # an event's field: the node whose clock took its time (the warm coordinator's)
EVENT_JOB_START = "job_start"  # batch script, before the ranks are launched
EVENT_PROCESS_START = "process_start"  # rank 0, first thing in Python
EVENT_FRAMEWORK_READY = "framework_ready"  # rank 0, process group and model built
EVENT_CHECKPOINT_LOADED = "checkpoint_loaded"  # rank 0: {"step", "load_s"}; step 0 = cold start
EVENT_FIRST_STEP = "first_step"  # rank 0: {"step"} first step finished in this attempt
EVENT_COMPLETED = "completed"  # rank 0, target step reached and final digest written
EVENT_WARNED = "warned"  # rank 0: {"step", "signal", "received_at", "checkpoint_s"}: saved on the warning
EVENT_STEP_EXIT = "step_exit"  # batch script: {"exit_code"} when the rank launch returns
# The warm coordinator (experiments/warm/), or the supervisor of torchrun's workers under elastic: a
# rank of this attempt died {"rank", "exit_code", ...};
# the plan of this attempt (a re-formation: {"resume", "source_rank", "step", "spares_used", ...}).
EVENT_WARM_FAILURE = "warm_failure"
EVENT_WARM_PLAN = "warm_plan"
EVENT_ELASTIC_ROUND = "elastic_round"  # torchrun started its workers again: the attempt's acceptance
EVENT_WARM_REFUSED = "warm_refused"  # the coordinator turned a connection away (no proof, a slot not launched)
EVENT_WARM_FORMED = "warm_formed"  # the coordinator: every member of this attempt said hello


def rank_job_to_dict(job: RankJob) -> dict[str, Any]:
    return asdict(job)


def rank_job_from_dict(data: dict[str, Any]) -> RankJob:
    """The inverse of ``rank_job_to_dict`` (JSON lists become the tuples the dataclasses hold)."""
    workload = dict(data["workload"])
    command = workload.get("command")
    if command is not None:
        workload["command"] = CommandSpec(**{
            **command, "argv": tuple(command["argv"]), "resume_args": tuple(command.get("resume_args", ())),
            "env": tuple((str(name), str(value)) for name, value in command.get("env", ())),
        })
    known = {name: value for name, value in data.items() if name in RankJob.__dataclass_fields__}
    workload = {name: value for name, value in workload.items() if name in WorkloadSpec.__dataclass_fields__}
    # Fields a newer Faultdrill adds are left out: a rank API installed from an older build of the
    # wheel (scripts/build-rank-api) still starts.
    return RankJob(**{**known, "workload": WorkloadSpec(**workload),
                      "exclude_nodes": tuple(data.get("exclude_nodes", ())),
                      "fault_steps": tuple(data.get("fault_steps", ()))})


def append_json_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line; a single write so concurrent appenders do not interleave."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_json_lines_backwards(path: Path, chunk_bytes: int = 1 << 16) -> Iterator[dict[str, Any]]:
    """A JSON-lines file's records from the last to the first, read in chunks from its end: a
    reader that wants the newest lines pays for those, not for the file's age. A torn or broken
    line is skipped, as by read_json_lines."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        end = handle.seek(0, os.SEEK_END)
        tail = b""
        while end > 0:
            start = max(0, end - chunk_bytes)
            handle.seek(start)
            lines = (handle.read(end - start) + tail).split(b"\n")
            end = start
            tail = lines.pop(0) if end > 0 else b""  # the first may continue in the chunk before
            for line in reversed(lines):
                if record := _json_record(line):
                    yield record
        if record := _json_record(tail):
            yield record


def _json_record(line: bytes) -> dict[str, Any] | None:
    """One line's object; None for anything else (a torn line; a run of NULs a node crash left,
    which json.loads would take for UTF-16 or -32 bytes and fail to decode)."""
    try:
        text = line.decode("utf-8", errors="replace")
        record = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


Record = TypeVar("Record")


class JsonlTail(Generic[Record]):
    """An incremental reader of a JSON-lines file ranks and batch scripts append to (the controller's
    watch, an at_step fault's agent): only what was appended since the last call, each line through
    ``parse`` (a record's ``from_json``); a torn last line waits for its end, a line that is no record
    is skipped. ``stat_first``: the file is on this host's own filesystem (experiments.runtime.mounts),
    where its size is looked up without opening it, and it is opened only when it grew; with
    ``changes`` (the controller's: experiments.file_changes), not even looked up until the kernel said
    it was written (its directory watched while the tail lives)."""

    def __init__(self, path: Path, parse: Callable[[dict[str, Any]], Record], stat_first: bool = False,
                 changes: FileChanges | None = None) -> None:
        self.path, self.parse = path, parse
        self._where = os.fspath(path)  # a Path made a str at every call costs as much as the stat
        self._directory, self._name = os.path.split(self._where)
        self.stat_first = stat_first
        self.changes = changes if stat_first else None
        self._watched = False
        self._generation = 0
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[Record]:
        chunk = self._appended()
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        records = []
        for line in lines:
            try:
                records.append(self.parse(json.loads(line.decode("utf-8", errors="replace"))))
            except (ValueError, KeyError, TypeError, AttributeError):  # a torn line, NULs a node crash left
                continue
        return records

    def _appended(self) -> bytes:
        """The bytes past the offset, b"" when there are none (the controller's watch asks every
        round for every file of every run in flight: a file that did not grow costs an open, a
        stat and a close, no buffered reader; on this host's own filesystem a stat alone). The file
        is opened each time, never kept open: on NFS the open is what sees another node's appends
        (close-to-open consistency, which a stat of its cached attributes does not give), and the
        size is taken from the open file, after it."""
        if self.changes is not None and self._unwritten():
            return b""
        if self.stat_first:
            try:
                if os.stat(self._where).st_size <= self._offset:
                    return b""
            except FileNotFoundError:
                return b""
        try:
            descriptor = os.open(self._where, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            size = os.fstat(descriptor).st_size
            return os.pread(descriptor, size - self._offset, self._offset) if size > self._offset else b""
        finally:
            os.close(descriptor)


    def _unwritten(self) -> bool:
        """The kernel said nothing of the file since this tail last looked. The look right after its
        directory's watch is added, and after the kernel dropped events, is made whatever it said."""
        changes = self.changes
        assert changes is not None
        if not self._watched:
            self._watched = changes.watch(self._directory)
            if self._watched:
                self._generation = changes.generation
                weakref.finalize(self, changes.release, self._directory)
            return False
        if self._generation != changes.generation:
            self._generation = changes.generation
            return False
        return not changes.take(self._directory, self._name)


class EventsTail:
    """An incremental reader of every writer's events file of one attempt (or of ``writers``: the
    run's, a file no writer of it makes is not opened each round): what each appended since the
    last call, merged in time order."""

    def __init__(self, paths: "RunPaths", attempt: int, writers: tuple[str, ...] | None = None,
                 stat_first: bool = False, changes: FileChanges | None = None) -> None:
        self.tails = [JsonlTail(path, EventRecord.from_json, stat_first, changes)
                      for path in paths.event_files(attempt, writers)]

    def read_new(self) -> list[EventRecord]:
        return by_time([tail.read_new() for tail in self.tails])


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file, skipping a torn last line (a writer killed mid-write)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def write_json_atomic(path: Path, record: dict[str, Any] | list[Any]) -> None:
    """Write a JSON file durably: temporary name, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(record, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def record_dict(record: Any) -> dict[str, Any]:
    return asdict(record)
