"""What every backend offers the controller: submit, poll in one batched call, cancel, inject."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from experiments.layout import RankJob
from injectors.kill_rank import FaultOutcome
from orchestrator.runs import RunConfig
from orchestrator.states import JobState


@dataclass(frozen=True)
class Submission:
    job_id: str
    accepted_at: float  # wall time the scheduler accepted the job (sbatch returned)


@dataclass(frozen=True)
class KillRequest:
    run: RunConfig
    attempt: int
    job_id: str
    rank: int
    signal: str


class Backend(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def submit(self, run: RunConfig, job: RankJob) -> Submission:
        """Submit one attempt of ``run``; returns once the scheduler has accepted it."""

    def submit_array(self, items: list[tuple[RunConfig, RankJob]]) -> list[Submission]:
        """Submit several runs' attempts together (a job array where the scheduler has them);
        runs in one call share their resources. Without arrays: one submission each."""
        return [self.submit(run, job) for run, job in items]

    def find_submitted(self, run: RunConfig, attempt: int) -> str | None:
        """The job of ``attempt`` if the scheduler accepted it although its id was never recorded."""
        return None

    def adopt(self, job_id: str, run: RunConfig) -> None:
        """Watch a job that an earlier controller process submitted (nothing to do for most backends)."""

    @abc.abstractmethod
    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """States of all ``job_ids`` in one batched call; ids the scheduler does not know are UNKNOWN."""

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Ask the scheduler to end the job (no error if it already ended)."""

    @abc.abstractmethod
    def kill_rank(self, request: KillRequest) -> FaultOutcome:
        """Signal one verified rank of the job, acting on the node where it runs."""
