"""A training script for drill tests that knows nothing of Faultdrill and needs no framework: it logs
`step N loss X` every --step-s seconds, saves its own checkpoint (ckpt-<step>.json) every
--save-every steps into --ckpt-dir, and with --resume continues from the newest one."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    start, value = 0, 1.0
    found = sorted(args.ckpt_dir.glob("ckpt-*.json"), key=lambda path: int(re.findall(r"\d+", path.name)[-1]))
    if args.resume and found:
        state = json.loads(found[-1].read_text())
        start, value = state["step"], state["value"]
        print(f"resumed from {found[-1]} at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        value = value * 0.999 + 0.001
        print(f"step {step} loss {value:.5f}", flush=True)
        if step % args.save_every == 0:
            temporary = args.ckpt_dir / f".ckpt-{step}.{os.getpid()}"
            temporary.write_text(json.dumps({"step": step, "value": value}))
            os.replace(temporary, args.ckpt_dir / f"ckpt-{step}.json")


if __name__ == "__main__":
    main()
