"""The rank API's file collectives between real processes' worth of ranks (threads here: the files
are the only channel): broadcasts, barriers, a missing peer named, old meetings cleaned up."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from experiments.runtime.meeting import FileCollectives, MeetingTimeout


def _ranks(directory: Path, world: int, work) -> list:
    results: list = [None] * world

    def one(rank: int) -> None:
        try:
            results[rank] = work(FileCollectives(directory, rank, world, timeout_s=20))
        except BaseException as error:  # handed back to the test
            results[rank] = error

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_ranks_agree_on_rank_0s_values_and_old_meetings_are_forgotten(tmp_path: Path) -> None:
    def work(meet: FileCollectives) -> list[int]:
        seen = [meet.broadcast_int(100 * meet.rank + step) for step in range(5)]
        meet.barrier()
        seen.append(meet.broadcast_int(7 if meet.rank == 0 else -1))
        meet.barrier()
        return seen

    results = _ranks(tmp_path, 3, work)
    assert results == [[0, 1, 2, 3, 4, 7]] * 3
    left = sorted(int(path.name.split("-", 1)[0]) for path in tmp_path.iterdir())
    assert min(left) >= 8  # calls 1-7 are over once all met at call 8 (its own files stay)


def test_a_peer_that_never_comes_is_named(tmp_path: Path) -> None:
    meet = FileCollectives(tmp_path, 0, 2, timeout_s=0.3)
    with pytest.raises(MeetingTimeout, match="1-arrived-1 not there after 0.3 s"):
        meet.barrier()
    other = FileCollectives(tmp_path / "b", 1, 2)
    with pytest.raises(MeetingTimeout, match="from rank 0"):
        other.broadcast_int(0, timeout_s=0.2)
