"""LOCAL_RANK under a per-task GPU binding (real-sites issue, item 9): with ``--gpus-per-task=1``
each task sees one GPU (CUDA_VISIBLE_DEVICES is its own), so ``set_device(LOCAL_RANK)`` with
LOCAL_RANK = SLURM_LOCALID failed on every rank but the node's first. No GPU here: the mapping
from the scheduler's variables, as Slurm and PBS's cgroup hooks set them, is what is tested."""

from __future__ import annotations

import pytest

from experiments.runtime.distenv import device_local_rank

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("environ", "local_rank", "device"), [
    ({}, 3, 3),  # no GPU listed: the local rank, as before
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 3, 3),  # every task sees the node's four GPUs
    ({"CUDA_VISIBLE_DEVICES": "3"}, 3, 0),  # --gpus-per-task=1: the task's own GPU is its device 0
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 3, 1),  # two a task, the second task's: its second GPU
    # --gpus-per-task without a per-task binding (Slurm 20.11, or --gpu-bind=none): every task sees
    # every GPU, so each keeps its own index
    ({"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 2),
    ({"CUDA_VISIBLE_DEVICES": "MIG-1b2c3d4e-0000-1111-2222-333344445555,MIG-5e6f7a8b-0000-1111-2222-333344445555"},
     1, 0),  # CUDA shows a process one MIG device, whatever the list names
    ({"ROCR_VISIBLE_DEVICES": "5"}, 1, 0),  # AMD's variable
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 1, 1),  # Slurm's word for none: not a GPU list
])
def test_local_rank_is_the_tasks_index_among_the_gpus_it_sees(environ: dict[str, str], local_rank: int,
                                                              device: int) -> None:
    assert device_local_rank(environ, local_rank) == device
