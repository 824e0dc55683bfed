"""A long job's failures at scale, simulated (issue 25): Monte Carlo over replicas, vectorized.

The job needs ``solve_s`` of useful training. It works in segments of ``interval_s`` of training,
each followed by a checkpoint that blocks training for ``checkpoint_s``. Failures arrive as a
Poisson process of mean ``mttf_s`` on the wall clock, during training, checkpoints and restarts
alike. A failure takes a node with probability ``node_share`` (it needs a spare node), else a
process (a restart in place is enough). Where the job goes on depends on the strategy's
``Recovery`` for that failure:

- one that **rolls back** loses the work since the last completed checkpoint (the partial
  checkpoint too) and restarts after its restart time;
- one that **keeps the work** (warm, a survivor's state) loses only its measured ``lost_s``;
- a node failure takes a spare when the strategy has a recovery for it and a spare is free; the
  spare comes back after ``repair_s``; without one the job ends and a new job (``new_job``) starts,
  from the checkpoint;
- a failure during a restart starts that restart again (Daly's model: the restart is paid again).

With exponential failures, one fixed restart R and checkpoint cost C, a job's expected wall time is
exactly Daly's higher-order formula (Daly 2006, FGCS 22(3)): each segment of length s = interval +
C costs M e^(R/M) (e^(s/M) - 1) in expectation (``daly_wall_s``; tests/unit/test_project_simulate.py).
Each replica is one lane of NumPy arrays; a round of the loop is one failure (or the end) of every
lane still running.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PHASES = ("detect_s", "resubmit_s", "queue_s", "startup_s", "load_s", "first_step_s")


@dataclass(frozen=True)
class Recovery:
    """How long one kind of recovery takes: ``phases`` rows of measured phase durations (s), one
    row a recovery, resampled; ``keeps_work``: it resumes from a survivor's state (``lost_s``:
    the measured re-done work of each row) instead of the last checkpoint."""

    phases: np.ndarray  # (n, len(PHASES))
    keeps_work: bool = False
    lost_s: np.ndarray | None = None  # (n,), for keeps_work

    @classmethod
    def fixed(cls, seconds: float, keeps_work: bool = False, lost_s: float = 0.0) -> "Recovery":
        phases = np.zeros((1, len(PHASES)))
        phases[0, 0] = seconds
        return cls(phases, keeps_work, np.array([lost_s]) if keeps_work else None)

    @property
    def mean_s(self) -> float:
        return float(self.phases.sum(axis=1).mean())


@dataclass(frozen=True)
class Scenario:
    """One job at one scale under one strategy, spare count and checkpoint interval."""

    solve_s: float  # useful training the job needs
    mttf_s: float  # the job's mean time between failures at its scale
    interval_s: float  # training between two checkpoints
    checkpoint_s: float  # what a checkpoint blocks training for
    process: Recovery  # a failure that leaves the nodes (a restart in place, or a new job: resubmit)
    new_job: Recovery  # the job ended and a new one started (from the checkpoint)
    node: Recovery | None = None  # a node failure answered with a spare; None: every node failure is a new job
    node_share: float = 0.0  # failures that take a node
    spares: int = 0
    repair_s: float = 24 * 3600.0  # a dead node's time out of the pool


@dataclass(frozen=True)
class Outcome:
    """Per replica: wall time, failures, and where the time that was not training went."""

    wall_s: np.ndarray
    failures: np.ndarray
    checkpoint_s: np.ndarray  # blocking checkpoints (the partial one a failure interrupted: rework)
    rework_s: np.ndarray  # training done again (rolled back, or a warm recovery's lost steps)
    restart_s: np.ndarray  # (replicas, len(PHASES)): each phase of every recovery, restarts that failed included
    new_jobs: np.ndarray  # failures the job did not survive (no spare for a dead node, or the strategy's way)
    solve_s: float

    @property
    def goodput(self) -> np.ndarray:
        return self.solve_s / self.wall_s


def simulate(scenario: Scenario, replicas: int, rng: np.random.Generator) -> Outcome:
    s = scenario
    tau, delta, mttf = float(s.interval_s), float(s.checkpoint_s), float(s.mttf_s)
    if tau <= 0 or delta < 0 or mttf <= 0 or s.solve_s <= 0:
        raise ValueError("interval, MTTF and solve time must be > 0, the checkpoint cost >= 0")
    segment = tau + delta
    remaining = np.full(replicas, float(s.solve_s))  # training still to do (work since the last checkpoint counted as done)
    offset = np.zeros(replicas)  # training since the last completed checkpoint
    wall = np.zeros(replicas)
    failures = np.zeros(replicas, dtype=np.int64)
    new_jobs = np.zeros(replicas, dtype=np.int64)
    checkpointing = np.zeros(replicas)
    rework = np.zeros(replicas)
    restart = np.zeros((replicas, len(PHASES)))
    spare_back = np.zeros((replicas, max(s.spares, 1)))  # when each spare node is free again
    if s.spares == 0:
        spare_back[:] = np.inf
    running = np.arange(replicas)
    while running.size:
        gap = rng.exponential(mttf, running.size)  # training time until this lane's next failure
        u, p = remaining[running], offset[running]
        # checkpoints before the end (none at the end): one at every segment boundary crossed
        ckpts_to_end = np.maximum(np.ceil((p + u) / tau - 1e-12) - 1, 0)
        to_end = u + ckpts_to_end * delta
        ends = gap >= to_end
        done = running[ends]
        wall[done] += to_end[ends]
        checkpointing[done] += ckpts_to_end[ends] * delta
        remaining[done] = 0.0
        lanes, x, u, p = running[~ends], gap[~ends], u[~ends], p[~ends]
        first = tau - p + delta  # until the next checkpoint is complete
        before = x < first
        k = np.where(before, 0, np.floor((x - first) / segment) + 1)  # checkpoints completed
        since = np.where(before, x, x - first - (k - 1) * segment)  # wall time since the last one (or the start)
        trained = np.where(before, np.minimum(x, tau - p), (tau - p) + (k - 1) * tau + np.minimum(since, tau))
        position = np.where(before, p + trained, np.minimum(since, tau))  # training since the last checkpoint
        wasted_checkpoint = np.where(before, np.maximum(x - (tau - p), 0), np.maximum(since - tau, 0))
        wall[lanes] += x
        checkpointing[lanes] += k * delta
        rework[lanes] += wasted_checkpoint
        remaining[lanes] = u - trained
        failures[lanes] += 1
        recovery_of = _recoveries(s, lanes, wall, spare_back, rng)
        for recovery, chosen in recovery_of:
            if not chosen.size:
                continue
            where = np.searchsorted(lanes, chosen)
            rows = rng.integers(0, recovery.phases.shape[0], chosen.size)
            if recovery is s.new_job:
                new_jobs[chosen] += 1
            if recovery.keeps_work:
                lost = np.minimum(recovery.lost_s[rows] if recovery.lost_s is not None else 0.0, position[where])
                remaining[chosen] += lost
                rework[chosen] += lost
                offset[chosen] = position[where] - lost
            else:
                remaining[chosen] += position[where]
                rework[chosen] += position[where]
                offset[chosen] = 0.0
            _restart(recovery.phases[rows], chosen, mttf, wall, restart, failures, rng)
        running = lanes
    return Outcome(wall, failures, checkpointing, rework, restart, new_jobs, float(s.solve_s))


def _recoveries(s: Scenario, lanes: np.ndarray, wall: np.ndarray, spare_back: np.ndarray,
                rng: np.random.Generator) -> list[tuple[Recovery, np.ndarray]]:
    """Which recovery each failed lane takes: a node failure takes a free spare (back after the
    repair) where the strategy answers node failures with one, else the job ends (a new job)."""
    node_failed = rng.random(lanes.size) < s.node_share
    if s.node is None:
        with_spare = np.zeros(lanes.size, dtype=bool)
    else:
        free = spare_back[lanes] <= wall[lanes, None]
        with_spare = node_failed & free.any(axis=1)
        taken = lanes[with_spare]
        slot = np.argmax(free[with_spare], axis=1)
        spare_back[taken, slot] = wall[taken] + s.repair_s
    process_failed = lanes[~node_failed]
    node_new_job = lanes[node_failed & ~with_spare]
    groups: list[tuple[Recovery, np.ndarray]] = []
    if s.process is s.new_job:
        groups.append((s.new_job, np.sort(np.concatenate([process_failed, node_new_job]))))
    else:
        groups += [(s.process, process_failed), (s.new_job, node_new_job)]
    if s.node is not None:
        groups.append((s.node, lanes[with_spare]))
    return groups


def _restart(phases: np.ndarray, lanes: np.ndarray, mttf: float, wall: np.ndarray, restart: np.ndarray,
             failures: np.ndarray, rng: np.random.Generator) -> None:
    """Each lane's restart, started again by every failure that comes before it is over."""
    length = phases.sum(axis=1)
    pending = np.arange(lanes.size)
    while pending.size:
        gap = rng.exponential(mttf, pending.size)
        failed = gap < length[pending]
        over = pending[~failed]
        wall[lanes[over]] += length[over]
        restart[lanes[over]] += phases[over]
        again = pending[failed]
        wall[lanes[again]] += gap[failed]
        restart[lanes[again], 0] += gap[failed]  # a restart cut short: time lost to detection's column
        failures[lanes[again]] += 1
        pending = again


def daly_wall_s(solve_s: float, mttf_s: float, interval_s: float, checkpoint_s: float, restart_s: float) -> float:
    """Daly's expected wall time of the job (every segment but the last followed by a checkpoint)."""
    segments = solve_s / interval_s
    whole = np.floor(segments - 1e-12)
    last = solve_s - whole * interval_s
    scale = mttf_s * np.exp(restart_s / mttf_s)
    return float(scale * (whole * np.expm1((interval_s + checkpoint_s) / mttf_s) + np.expm1(last / mttf_s)))


def young_interval_s(checkpoint_s: float, mttf_s: float) -> float:
    """Young's optimum (1974): sqrt(2 C M)."""
    return float(np.sqrt(2 * checkpoint_s * mttf_s))


def daly_interval_s(checkpoint_s: float, mttf_s: float) -> float:
    """Daly's higher-order optimum (2006), for C < 2M; M beyond it."""
    if checkpoint_s >= 2 * mttf_s:
        return float(mttf_s)
    ratio = checkpoint_s / (2 * mttf_s)
    return float(np.sqrt(2 * checkpoint_s * mttf_s) * (1 + np.sqrt(ratio) / 3 + ratio / 9) - checkpoint_s)
