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
- a failure from a restart's start-up on (the job holds its nodes again) starts the start-up again
  (Daly's model, for the part of a restart a failure can strike: detection and the queue hold no nodes);
- a new job comes with its own spare nodes.

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
WALL_CAP = 10.0  # a replica whose wall time passes 10 x its training stops: goodput < 10 %, no answer needed
EXPOSED_FROM = PHASES.index("startup_s")  # the phases a failure can strike: the job holds its nodes again


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
        phases[0, PHASES.index("startup_s")] = seconds  # all of it on the nodes (Daly's restart)
        return cls(phases, keeps_work, np.array([lost_s]) if keeps_work else None)


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
    process_new_job_share: float = 0.0  # of the others, those the strategy answers with a new job (warm: a hang)
    spares: int = 0
    repair_s: float = 24 * 3600.0  # a dead node's time out of the pool


@dataclass(frozen=True)
class Outcome:
    """Per replica: wall time, failures, and where the time that was not training went."""

    wall_s: np.ndarray
    failures: np.ndarray
    checkpoint_s: np.ndarray  # blocking checkpoints (the partial one a failure interrupted: rework)
    rework_s: np.ndarray  # training done again (rolled back, or a warm recovery's lost steps)
    restart_s: np.ndarray  # (replicas,): every recovery's time, restarts that failed included
    restart_phases_s: np.ndarray  # (len(PHASES),): the mean replica's restart time by phase (a start-up cut short: startup_s)
    new_jobs: np.ndarray  # failures the job did not survive (no spare for a dead node, or the strategy's way)
    solve_s: float

    @property
    def goodput(self) -> np.ndarray:
        return self.solve_s / self.wall_s


def simulate(scenario: Scenario, replicas: int, rng: np.random.Generator) -> Outcome:
    return simulate_many([scenario], replicas, rng)[0]


@dataclass
class _Recoveries:
    """Every distinct recovery of the scenarios, as one table: its rows' phases and lost work, and
    per recovery its first row, its number of rows and whether it keeps the work."""

    phases: np.ndarray
    lost: np.ndarray
    first: np.ndarray
    count: np.ndarray
    keeps: np.ndarray

    @classmethod
    def of(cls, recoveries: list[Recovery]) -> "_Recoveries":
        firsts = np.cumsum([0] + [r.phases.shape[0] for r in recoveries[:-1]])
        lost = [r.lost_s if r.lost_s is not None else np.zeros(r.phases.shape[0]) for r in recoveries]
        return cls(np.concatenate([r.phases for r in recoveries]), np.concatenate(lost), firsts,
                   np.array([r.phases.shape[0] for r in recoveries]), np.array([r.keeps_work for r in recoveries]))


def simulate_many(scenarios: list[Scenario], replicas: int, rng: np.random.Generator) -> list[Outcome]:
    """``replicas`` runs of every scenario, all of them lanes of the same arrays (a grid of cells
    costs about what its largest cell does)."""
    for s in scenarios:
        if s.interval_s <= 0 or s.checkpoint_s < 0 or s.mttf_s <= 0 or s.solve_s <= 0:
            raise ValueError("interval, MTTF and solve time must be > 0, the checkpoint cost >= 0")
    distinct: dict[int, int] = {}
    table: list[Recovery] = []
    for recovery in (r for s in scenarios for r in (s.process, s.new_job, s.node) if r is not None):
        if id(recovery) not in distinct:
            distinct[id(recovery)] = len(table)
            table.append(recovery)
    recoveries = _Recoveries.of(table)

    def per_lane(values: list[float]) -> np.ndarray:
        return np.repeat(np.array(values, dtype=float), replicas)

    tau = per_lane([s.interval_s for s in scenarios])
    delta = per_lane([s.checkpoint_s for s in scenarios])
    mttf = per_lane([s.mttf_s for s in scenarios])
    node_share = per_lane([s.node_share for s in scenarios])
    process_new_job = per_lane([s.process_new_job_share for s in scenarios])
    repair = per_lane([s.repair_s for s in scenarios])
    process_of = per_lane([distinct[id(s.process)] for s in scenarios]).astype(int)
    new_job_of = per_lane([distinct[id(s.new_job)] for s in scenarios]).astype(int)
    node_of = per_lane([distinct[id(s.node)] if s.node is not None else -1 for s in scenarios]).astype(int)
    lanes_total = tau.size
    slots = max([s.spares for s in scenarios] + [1])
    spare_back = np.full((lanes_total, slots), np.inf)  # when each spare node is free again (inf: none)
    for index, s in enumerate(scenarios):
        spare_back[index * replicas:(index + 1) * replicas, :s.spares] = 0.0
    solve = per_lane([s.solve_s for s in scenarios])
    remaining = solve.copy()  # training still to do (since the last checkpoint: done)
    offset = np.zeros(lanes_total)  # training since the last completed checkpoint
    wall = np.zeros(lanes_total)
    failures = np.zeros(lanes_total, dtype=np.int64)
    new_jobs = np.zeros(lanes_total, dtype=np.int64)
    checkpointing = np.zeros(lanes_total)
    rework = np.zeros(lanes_total)
    restart = np.zeros(lanes_total)
    cell_of = np.repeat(np.arange(len(scenarios)), replicas)
    phase_sums = np.zeros((len(scenarios), len(PHASES)))  # per cell: the sum over its replicas
    running = np.arange(lanes_total)
    while running.size:
        t, d, m = tau[running], delta[running], mttf[running]
        gap = rng.exponential(m)  # time until this lane's next failure
        u, p = remaining[running], offset[running]
        ckpts_to_end, to_end = _to_the_end(u, p, t, d)
        ends = gap >= to_end
        done = running[ends]
        wall[done] += to_end[ends]
        checkpointing[done] += ckpts_to_end[ends] * d[ends]
        remaining[done] = 0.0
        failed = ~ends
        lanes, x, u, p, t, d, m = running[failed], gap[failed], u[failed], p[failed], t[failed], d[failed], m[failed]
        k, trained, position, cut_short = _work_until(x, p, t, d)
        wall[lanes] += x
        checkpointing[lanes] += k * d
        rework[lanes] += cut_short
        remaining[lanes] = u - trained
        failures[lanes] += 1
        chosen = _choose(lanes, wall, node_share, process_new_job, process_of, new_job_of, node_of, spare_back, repair,
                         rng)
        # a new job comes with its own spares (the dead nodes stay in repair outside it)
        renewed = lanes[(chosen == new_job_of[lanes]) & np.isfinite(spare_back[lanes, 0])]
        spare_back[renewed] = np.where(np.isfinite(spare_back[renewed]), 0.0, np.inf)
        new_jobs[lanes] += chosen == new_job_of[lanes]
        rows = recoveries.first[chosen] + (rng.random(lanes.size) * recoveries.count[chosen]).astype(int)
        keeps = recoveries.keeps[chosen]
        lost = np.where(keeps, np.minimum(recoveries.lost[rows], position), position)
        remaining[lanes] += lost
        rework[lanes] += lost
        offset[lanes] = np.where(keeps, position - lost, 0.0)
        _restart(recoveries.phases[rows], lanes, m, wall, restart, failures, rng)
        _add_phases(phase_sums, cell_of[lanes], recoveries.phases[rows])
        # a job that could not finish (its goodput under 1 / WALL_CAP) stops here: its cell says so
        running = lanes[wall[lanes] < WALL_CAP * solve[lanes]]
    return _outcomes(scenarios, replicas, wall, failures, checkpointing, rework, restart, new_jobs, phase_sums)


def _to_the_end(u: np.ndarray, p: np.ndarray, t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From ``p`` of training since the last checkpoint, ``u`` left to train: the checkpoints
    before the end (one at every segment boundary crossed, none at the end) and the time it takes."""
    checkpoints = np.maximum(np.ceil((p + u) / t - 1e-12) - 1, 0)
    return checkpoints, u + checkpoints * d


def _work_until(x: np.ndarray, p: np.ndarray, t: np.ndarray, d: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A failure ``x`` after work resumed ``p`` into its segment: the checkpoints completed, the
    training done, the training since the last checkpoint, and a checkpoint's time it cut short."""
    first = t - p + d  # until the next checkpoint is complete
    before = x < first
    k = np.where(before, 0, np.floor((x - first) / (t + d)) + 1)
    since = np.where(before, x, x - first - (k - 1) * (t + d))  # since the last one completed (or the start)
    trained = np.where(before, np.minimum(x, t - p), (t - p) + (k - 1) * t + np.minimum(since, t))
    position = np.where(before, p + trained, np.minimum(since, t))
    cut_short = np.where(before, np.maximum(x - (t - p), 0), np.maximum(since - t, 0))
    return k, trained, position, cut_short


@dataclass(frozen=True)
class Replayed:
    """A drill's own run replayed: its wall time from its first step to its end, and its parts."""

    wall_s: float
    rework_s: float
    checkpoint_s: float
    restart_s: float


def replay(solve_s: float, interval_s: float, checkpoint_s: float, gaps_s: list[float],
           recoveries: list[tuple[float, bool, float]]) -> Replayed:
    """The model's account of one run with the failures it had: the k-th came ``gaps_s[k]`` after
    training resumed; each recovery (restart seconds, kept the work, its lost work) as measured.
    The same arithmetic as ``simulate_many``, with the drill's failures instead of drawn ones."""
    if any(gap < 0 for gap in gaps_s):
        raise ValueError("a failure before training resumed (a negative gap) cannot be replayed")
    t, d = np.array([interval_s]), np.array([checkpoint_s])
    remaining, offset = np.array([solve_s]), np.array([0.0])
    wall = rework = checkpointing = restarting = 0.0
    for gap, (restart_s, keeps_work, lost_s) in zip(gaps_s, recoveries, strict=True):
        checkpoints, to_end = _to_the_end(remaining, offset, t, d)
        if gap >= to_end[0]:
            break
        k, trained, position, cut_short = _work_until(np.array([gap]), offset, t, d)
        wall += gap + restart_s
        checkpointing += float(k[0]) * checkpoint_s
        lost = min(lost_s, float(position[0])) if keeps_work else float(position[0])
        rework += float(cut_short[0]) + lost
        restarting += restart_s
        remaining = remaining - trained + lost
        offset = np.array([float(position[0]) - lost if keeps_work else 0.0])
    checkpoints, to_end = _to_the_end(remaining, offset, t, d)
    return Replayed(wall + float(to_end[0]), rework, checkpointing + float(checkpoints[0]) * checkpoint_s, restarting)


def _add_phases(sums: np.ndarray, cells: np.ndarray, phases: np.ndarray) -> None:
    for phase in range(phases.shape[1]):
        sums[:, phase] += np.bincount(cells, weights=phases[:, phase], minlength=sums.shape[0])


def _outcomes(scenarios: list[Scenario], replicas: int, wall: np.ndarray, failures: np.ndarray,
              checkpointing: np.ndarray, rework: np.ndarray, restart: np.ndarray, new_jobs: np.ndarray,
              phase_sums: np.ndarray) -> list[Outcome]:
    """Each cell's lanes, its phases' means; the time of restarts cut short goes to detection's."""
    outcomes = []
    for index, scenario in enumerate(scenarios):
        cell = slice(index * replicas, (index + 1) * replicas)
        phases = phase_sums[index] / replicas
        phases[EXPOSED_FROM] += restart[cell].mean() - phases.sum()  # start-ups cut short
        outcomes.append(Outcome(wall[cell], failures[cell], checkpointing[cell], rework[cell], restart[cell],
                                phases, new_jobs[cell], float(scenario.solve_s)))
    return outcomes


def _choose(lanes: np.ndarray, wall: np.ndarray, node_share: np.ndarray, process_new_job: np.ndarray,
            process_of: np.ndarray, new_job_of: np.ndarray, node_of: np.ndarray, spare_back: np.ndarray,
            repair: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The recovery each failed lane takes: a node failure takes a free spare (back after the
    repair) where the strategy answers node failures with one, else the job ends (a new job)."""
    node_failed = rng.random(lanes.size) < node_share[lanes]
    asking = np.flatnonzero(node_failed & (node_of[lanes] >= 0))  # of the failed lanes, those with spares to ask
    free = spare_back[lanes[asking]] <= wall[lanes[asking], None]
    found = free.any(axis=1)
    with_spare = np.zeros(lanes.size, dtype=bool)
    with_spare[asking[found]] = True
    taken = lanes[asking[found]]
    spare_back[taken, np.argmax(free[found], axis=1)] = wall[taken] + repair[taken]
    draw = rng.random(lanes.size)
    to_new_job = node_failed | (draw < process_new_job[lanes])
    return np.where(with_spare, node_of[lanes], np.where(to_new_job, new_job_of[lanes], process_of[lanes]))


def _restart(phases: np.ndarray, lanes: np.ndarray, mttf: np.ndarray, wall: np.ndarray, restart: np.ndarray,
             failures: np.ndarray, rng: np.random.Generator) -> None:
    """Each lane's restart: detection, resubmission and the queue hold no nodes a failure could
    strike; from the start-up on, every failure before the first step starts it again."""
    waited = phases[:, :EXPOSED_FROM].sum(axis=1)
    wall[lanes] += waited
    restart[lanes] += waited
    length = phases[:, EXPOSED_FROM:].sum(axis=1)
    pending = np.arange(lanes.size)
    while pending.size:
        gap = rng.exponential(mttf[pending])
        failed = gap < length[pending]
        over = pending[~failed]
        wall[lanes[over]] += length[over]
        restart[lanes[over]] += length[over]
        again = pending[failed]
        wall[lanes[again]] += gap[failed]
        restart[lanes[again]] += gap[failed]  # a start-up cut short
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
