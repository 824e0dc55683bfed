"""The resume idioms users write, drilled zero-code, each report held against the script's own log
(issue 27's closing figures).

Each idiom's example campaign (experiments/campaigns/example-*.yaml; the scripts in
experiments/examples/ know nothing of Faultdrill and log ``<pid> <step> <time>`` for every step a
rank ran, ``--step-log``) is drilled on the local backend with its fault-free twin:

- torchrun DDP, ``torch.save`` into a relative ``checkpoint.pt`` (example-torchrun), and the same
  script started directly (``python``: one plain script, one relative checkpoint);
- Lightning ``ModelCheckpoint(save_last=True)`` + ``fit(ckpt_path="last")`` (example-lightning-last);
- Keras 3 ``BackupAndRestore(save_freq=N)``, killed mid-epoch (example-keras-backup);
- Chainer ``snapshot(autoload=True)`` into a relative ``result/`` (example-chainer-snapshot).

Per idiom: the kill's planned step, the step the report says it met and the step the script's log
had reached at the fault's time (late by, in steps: the floor is one step); the resumed step and the
lost steps as the report gives them and as the log shows them (the first step of the next attempt
minus one; the step reached minus that); the identity verdict against the twin (workload.outputs).

    .venv/bin/python bench/idioms.py [--only example-keras-backup,...] [--out bench/results/idioms.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CAMPAIGNS = REPO / "experiments" / "campaigns"
FAULTDRILL = [sys.executable, "-m", "orchestrator.cli"]
IDIOMS = {  # name -> (campaign, the command's launcher replaced by python: the same script started directly)
    "torchrun DDP, torch.save": ("example-torchrun", False),
    "plain script, relative checkpoint": ("example-torchrun", True),
    "Lightning ckpt_path=last": ("example-lightning-last", False),
    "Keras BackupAndRestore": ("example-keras-backup", False),
    "Chainer snapshot(autoload)": ("example-chainer-snapshot", False),
}


def _spec(campaign: str, direct: bool, workdir: Path) -> dict[str, Any]:
    spec = yaml.safe_load((CAMPAIGNS / f"{campaign}.yaml").read_text())
    spec["workdir"] = str(workdir)
    spec["baseline"] = True
    workload = spec["workload"]
    # A word naming a file beside the campaign, by its absolute path (the copy lies elsewhere).
    workload["command"] = [str((CAMPAIGNS / word).resolve()) if word.startswith("../") else word
                           for word in workload["command"]]
    if campaign == "example-torchrun":  # its final checkpoint.pt (in the run's own directory) is its identity
        workload["outputs"] = ["checkpoint.pt"]
    if direct:
        workload["command"] = ["python", *[word for word in workload["command"][1:] if not word.startswith("--nproc")]]
        spec["resources"]["tasks_per_node"] = 1
        spec["faults"][0]["rank"] = 0
    return spec


def _log(run_dir: Path) -> list[tuple[int, int, float]]:
    return [(int(pid), int(step), float(at)) for pid, step, at in
            (line.split() for line in (run_dir / "steps-0.log").read_text().splitlines())]


def drill(name: str, campaign: str, direct: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workdir = Path(tmp) / "work"
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(_spec(campaign, direct, workdir)))
        done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json", "--no-html"], cwd=REPO,
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
        [run] = [run for run in json.loads(done.stdout)["runs"] if not run["is_baseline"]]
        [fault], [recovery] = run["faults"], run["recoveries"]
        steps = _log(workdir / "runs" / run["run_id"])
        failed_pid = steps[0][0]
        reached = max(step for pid, step, at in steps if pid == failed_pid and at <= fault["at"])
        resumed = min(step for pid, step, _ in steps if pid != failed_pid) - 1
        outputs = run.get("outputs") or {}
        return {"idiom": name, "campaign": campaign, "planned": fault["planned_step"], "met": fault["met_step"],
                "reached": reached, "late_steps": reached - fault["planned_step"],
                "resumed_report": recovery["resumed_from_step"], "resumed_log": resumed,
                "lost_report": recovery["lost_steps"], "lost_log": reached - resumed,
                "identity": outputs.get("verdict"), "max_abs_diff": run.get("max_abs_weight_diff"),
                "outputs": outputs,
                "progress": run.get("progress")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="campaign names, comma-separated (default: every idiom)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "idioms.json")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    results = [drill(name, campaign, direct) for name, (campaign, direct) in IDIOMS.items()
               if not only or campaign in only]
    print(f"{'idiom':<34} {'planned':>7} {'met':>5} {'log':>5} {'late/1 step':>11} {'resumed rep/log':>16} "
          f"{'lost rep/log':>13}  identity")
    for row in results:
        diff = f" (max {row['max_abs_diff']:.3g})" if row["identity"] == "differs" and row["max_abs_diff"] else ""
        print(f"{row['idiom']:<34} {row['planned']:>7} {row['met']:>5} {row['reached']:>5} {row['late_steps']:>11} "
              f"{row['resumed_report']:>7}/{row['resumed_log']:<8} {row['lost_report']:>5}/{row['lost_log']:<7} "
              f"{row['identity']}{diff}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
