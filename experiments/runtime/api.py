"""The rank API: what a training script imports to be drilled exactly (stable; see the README).

    from experiments.runtime import api

    rank = api.init()                                   # once, first thing
    found = rank.resume()                               # newest valid checkpoint, or None
    start = found.step if found else 0
    if found:
        state = torch.load(found.path / "state.pt")     # the files your save wrote
    for step in range(start + 1, rank.steps + 1):
        loss = train_one_step(step)
        rank.step(step, loss)                           # heartbeat, first-step event, loss log
        warned = rank.preempted(step)                   # once a step, on every rank
        if rank.should_checkpoint(step) or warned:
            with rank.checkpoint(step) as directory:    # write your files into it
                torch.save(state, directory / "state.pt")
        if warned:
            rank.hold(step)                             # saved on the warning: wait for the end
    rank.done(weights=model.state_dict())               # or digest="..."

The store still owns durability: the files a rank writes into the directory it is handed are
fsynced, renamed into the checkpoint and listed in its receipt; rank 0 hashes them into the
manifest and publishes the checkpoint (on a thread with ``async_persist``). Ranks meet through
files in the attempt's directory unless the script hands its own collectives (``init(collectives=)``,
e.g. ``experiments.runtime.torch_state.TorchCollectives``). Under a drill the spec's steps,
checkpoint interval and run directory win over the arguments of ``init``, which serve a script run
by hand (a single rank in ./faultdrill-run).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from experiments.layout import (
    ENV_ASYNC_PERSIST,
    ENV_PROCESS_STARTED_AT,
    ENV_RANK_JOB,
    RankJob,
    RunPaths,
    WorkloadSpec,
    rank_job_from_dict,
)
from experiments.runtime.checkpoint import CheckpointMeta, ValidCheckpoint
from experiments.runtime.distenv import DistEnv, Timeouts
from experiments.runtime.fault_requests import FaultRequests
from experiments.runtime.meeting import FileCollectives
from experiments.runtime.rank_error import record_rank_error
from experiments.runtime.session import Collectives, RankSession, SessionOptions
from experiments.runtime.warning import WarningNote, hold_seconds, warning_signal

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Checkpoint", "Rank", "init"]

# What resume() hands back: .step, .path (the checkpoint's directory), .manifest (its files and hashes).
Checkpoint = ValidCheckpoint

STANDALONE_RUN_DIR = "faultdrill-run"


class Rank:
    """This process's rank of the run: where to resume, how to save, what to report."""

    def __init__(self, session: RankSession) -> None:
        self._session = session
        self._on_warning: list[Callable[[], None]] = []
        self._resumed = False
        self._since = time.monotonic()  # the end of the last step (or of the resume, or a checkpoint)

    # --- who and where ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._session.env.rank

    @property
    def world_size(self) -> int:
        return self._session.env.world_size

    @property
    def local_rank(self) -> int:
        return self._session.env.local_rank

    @property
    def attempt(self) -> int:
        return self._session.job.attempt

    @property
    def steps(self) -> int:
        """The step the run trains to (the spec's workload.steps under a drill)."""
        return self._session.job.workload.steps

    @property
    def checkpoint_every(self) -> int:
        return self._session.job.checkpoint_every

    @property
    def run_dir(self) -> Path:
        return self._session.paths.root

    @property
    def seed(self) -> int:
        return self._session.job.workload.seed

    # --- resume ------------------------------------------------------------------------------------

    def resume(self, load: Callable[[Path, int], None] | None = None, params: int | None = None) -> Checkpoint | None:
        """The newest valid checkpoint all ranks agree on, or None (a cold start). Call it once,
        when the model is built: the time until then is the attempt's start-up. With ``load``
        (directory, step) the API loads it and counts the load; a checkpoint that fails to load is
        kept out of the next attempt's choice. ``params``: the model's parameter count, for the
        report's checkpoint size overhead."""
        if self._resumed:
            raise RuntimeError("resume() is called once per process")
        self._resumed = True
        if params is not None:
            self._session.ready(params=float(params))
        else:
            self._session.ready()
        found = self._session.resume(load)
        self._since = time.monotonic()
        return found

    # --- progress -----------------------------------------------------------------------------------

    def step(self, step: int, loss: float | None = None) -> None:
        """Step ``step`` (1-based: the step-th update) is done on this rank."""
        if not self._resumed:
            raise RuntimeError("call resume() before the first step(): it marks the end of the start-up")
        now = time.monotonic()
        self._session.stepped(step, None if loss is None else float(loss), step_s=now - self._since)
        self._since = now

    def should_checkpoint(self, step: int) -> bool:
        """The spec's interval says: checkpoint after ``step``."""
        return self._session.checkpoint_due(step)

    # --- checkpoints --------------------------------------------------------------------------------

    @contextmanager
    def checkpoint(self, step: int) -> Iterator[Path]:
        """A directory for this rank's files of checkpoint ``step``; when the block ends, they are
        made durable and the checkpoint is published once every rank has delivered. If more than
        one rank writes, name the files per rank. Nothing is published if the block raises."""
        with self._session.writing(step) as sink, sink.scratch() as scratch:
            yield scratch
            adopt_all(sink, scratch)
        self._since = time.monotonic()  # a checkpoint's time is not a step's

    # --- the scheduler's warning ------------------------------------------------------------------------

    @property
    def warned(self) -> bool:
        """This rank received the warning (preemption, walltime near): its own view."""
        return self._session.warned

    def preempted(self, step: int) -> bool:
        """All ranks agree the warning came: checkpoint ``step`` now, then ``hold``. Every rank asks
        once at every step (the ranks compare notes every few steps: a collective)."""
        agreed = step < self.steps and self._session.warning_agreed(step)
        if agreed:
            for callback in self._on_warning:
                callback()
        return agreed

    def on_warning(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs on every rank at the step ``preempted`` first says True."""
        self._on_warning.append(callback)

    def hold(self, step: int) -> None:
        """After the warning's checkpoint: make it durable, note it, wait for the scheduler's end
        (exits with EXIT_WARNED if it never comes). Does not return."""
        self._session.checkpoint_on_warning(step, None)
        self._session.hold(step)

    # --- the end -----------------------------------------------------------------------------------

    def done(self, digest: str | None = None, weights: Any = None, step: int | None = None) -> str:
        """The run reached its last step on this rank: waits for every rank, then rank 0 writes
        the final record. ``weights`` (a mapping or (name, array) pairs: a state_dict works) gives
        the digest a resumed run is compared by, bit for bit; or pass your own ``digest``."""
        named = named_arrays(weights) if weights is not None else None
        if digest is None and named is None:
            raise ValueError("done() needs the final weights or a digest: the run is compared to its twin by it")
        from experiments.runtime.digest import digest_arrays

        value = digest if digest is not None else digest_arrays(named or [])
        final = self.steps if step is None else step
        return self._session.finish(final, lambda: value, (lambda: named) if named is not None else None)


def named_arrays(weights: Any) -> list[tuple[str, np.ndarray]]:
    """(name, array) pairs from a mapping (a state_dict) or pairs; tensors become NumPy arrays."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    return [(str(name), _array(value)) for name, value in items]


def _array(value: Any) -> np.ndarray:
    import numpy as np  # only where weights are given (a digest instead needs none)

    if hasattr(value, "detach"):  # torch.Tensor
        return value.detach().cpu().numpy()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # tf.Variable, keras variables
        return np.asarray(value.numpy())
    return np.asarray(value)


def adopt_all(sink: Any, scratch: Path) -> None:
    """Every file the script wrote under ``scratch`` (sub-directories flattened with '__')."""
    for path in sorted(scratch.rglob("*")):
        if path.is_file():
            sink.adopt(path, "__".join(path.relative_to(scratch).parts))


# --- init ----------------------------------------------------------------------------------------------

def init(*, steps: int | None = None, checkpoint_every: int | None = None, keep: int = 2, seed: int = 0,
         collectives: Collectives | None = None, framework: str = "other", file_format: str = "the script's own files",
         async_persist: bool | None = None, environ: Mapping[str, str] | None = None) -> Rank:
    """This rank's session. Under a drill everything comes from the drill (``FAULTDRILL_RANK_JOB``);
    run by hand, a single-rank session in ./faultdrill-run with the given steps and interval.
    ``async_persist``: True, rank 0 hashes and publishes a checkpoint on a thread while training
    goes on; False, ``checkpoint`` returns once it is published; None: FAULTDRILL_ASYNC_PERSIST
    (default on)."""
    env_map = os.environ if environ is None else environ
    job = _job_from_environment(env_map) or _standalone_job(steps, checkpoint_every, keep, seed)
    env = DistEnv.from_environ(env_map)
    paths = RunPaths(Path(job.run_dir))
    warning = _install_warning() if environ is None else None
    if environ is None:  # signal handlers and the excepthook: the real process only
        FaultRequests(paths.fault_request_file(job.attempt, env.rank)).install()
        _record_uncaught(paths, job.attempt, env.rank)
    timeouts = Timeouts.from_environ(env_map)
    meet = collectives or FileCollectives(paths.attempt_dir(job.attempt) / "meet", env.rank, env.world_size,
                                          timeouts.checkpoint_s)
    if async_persist is None:
        async_persist = env_map.get(ENV_ASYNC_PERSIST, "1") != "0"
    options = SessionOptions(timeouts=timeouts, async_persist=async_persist,
                             warning=warning, warning_hold_s=hold_seconds(env_map))
    meta = CheckpointMeta(framework=job.workload.framework or framework, format=file_format,
                          writers="all" if env.world_size > 1 else "rank0")
    started_at = float(env_map.get(ENV_PROCESS_STARTED_AT) or time.time())
    session = RankSession(job, env, meet, meta, options, started_at)
    if ENV_PROCESS_STARTED_AT in env_map:
        session.clear_stale()  # the supervisor noted the process's start
    else:
        session.started()
    return Rank(session)


def _job_from_environment(env: Mapping[str, str]) -> RankJob | None:
    text = env.get(ENV_RANK_JOB)
    return rank_job_from_dict(json.loads(text)) if text else None


def _standalone_job(steps: int | None, every: int | None, keep: int, seed: int) -> RankJob:
    if steps is None:
        raise ValueError("not under a drill (no FAULTDRILL_RANK_JOB): init(steps=...) says how far to train")
    run_dir = Path(STANDALONE_RUN_DIR).resolve()
    return RankJob(run_id="standalone", run_dir=str(run_dir), attempt=0,
                   workload=WorkloadSpec(framework="other", steps=steps, seed=seed),
                   checkpoint_every=every or 0, checkpoint_keep=keep)


def _record_uncaught(paths: RunPaths, attempt: int, rank: int) -> None:
    """An exception that ends the script is its rank's reason in the report, with its cause."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        record_rank_error(paths, attempt, rank, error)
        previous(kind, error, trace)

    sys.excepthook = hook


def _install_warning() -> WarningNote | None:
    signum = warning_signal()
    if signal.getsignal(signum) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return None  # the script handles it itself
    return WarningNote(signum).install()

