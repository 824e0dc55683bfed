"""One controller of the crash-point harness's SIGKILL mode (tests/drill/test_crash_points_sigkill.py),
as a real process: it loads the simulated cluster from WORLD, drives the drill of SPEC with the
harness's counter on every seam, and at crossing CRASH_AT (0: none) saves the cluster (a scheduler's
state is its own, durable) and SIGKILLs itself: no ``finally``, no ``atexit``, no flush, an open
sqlite transaction left as it was. Otherwise it saves the cluster at the end and prints the
crossings it saw.

    python tests/crash_child.py SPEC WORLD CRASH_AT
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from crash_harness import Crossings, drive, install  # noqa: E402
from simulated_cluster import SimulatedCluster  # noqa: E402


def save(world: SimulatedCluster, path: Path) -> None:
    temporary = path.with_name(path.name + ".new")
    temporary.write_bytes(pickle.dumps(world))
    os.replace(temporary, path)


def main() -> None:
    spec, world_file, crash_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    world: SimulatedCluster = pickle.loads(world_file.read_bytes())

    def die(why: str) -> None:
        save(world, world_file)
        os.kill(os.getpid(), signal.SIGKILL)

    crossings = Crossings(crash_at=crash_at or None, crash=die)
    install(setattr, crossings, world)
    drive(spec, world)
    save(world, world_file)
    print(len(crossings.seen))


if __name__ == "__main__":
    main()
