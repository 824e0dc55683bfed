"""A training script through the rank API and nothing else (no framework, no NumPy): what the rank
API needs of a training environment on another Python than Faultdrill's. Its state one number per
rank, its checkpoint that number as JSON, its digest the number (the same for a run and its twin
when the resume is exact)."""

import json
import sys
import time

from experiments.runtime import api

print(f"rank api: {api.__file__} on Python {sys.version.split()[0]}", file=sys.stderr, flush=True)
STEP_S = float(sys.argv[sys.argv.index("--step-s") + 1]) if "--step-s" in sys.argv else 0.01
rank = api.init()
state = {"w": 0.0}
found = rank.resume(lambda directory, step: state.update(json.loads((directory / f"rank{rank.rank}.json").read_text())))
start = found.step if found else 0
for step in range(start + 1, rank.steps + 1):
    time.sleep(STEP_S)
    state["w"] += 0.001 * step
    rank.step(step, state["w"])
    if rank.should_checkpoint(step):
        with rank.checkpoint(step) as directory:
            (directory / f"rank{rank.rank}.json").write_text(json.dumps(state))
rank.done(digest=f"{state['w']:.6f}")
