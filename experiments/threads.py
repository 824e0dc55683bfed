"""One thread per rank for the numeric libraries: ranks share the node's cores, and oversubscription
makes step times noisy. OpenBLAS, MKL and OpenMP read these once, when they are loaded, so they are
set before anything imports NumPy or a framework (submitit's task runner imports NumPy first: a rank
it starts is limited by experiments/task.py, which sets them before it hands over). A value the
rank inherits (the user's, the site's) wins."""

from __future__ import annotations

import os

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def limit_threads() -> None:
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
