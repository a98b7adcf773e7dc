#!/usr/bin/env python3
"""zerompi.train, every rank first saying where it runs and what zerompi chose for it: a drop-in for `python`.

    ZEROMPI_PYTHON=tests/support/rank_placement.py sbatch slurm/cpu_multi_node.sbatch [train flags]
    (slurm/common.sh runs "$ZEROMPI_PYTHON" -m zerompi.train)

When zerompi has set its BLAS thread limit, just before training, each rank prints one line to stderr:

    placement: rank 2 of 4 on zmpi2-node2: local rank 0, 2 ranks on its node, 1 BLAS threads

the node is MPI's processor name; the local rank is the one zerompi picks a GPU by
(zerompi/train/options/device_choice.py); the ranks on its node are zerompi's own count (Split_type); the BLAS
threads are those threadpoolctl finds in effect under zerompi's limit. The training is the real one
(zerompi.train.loop.run.main, real MPI); the driver only wraps two calls to see what they returned.
Used by tests/proofs/test_slurm_multi_node.py. `-c CODE` runs as python runs it (slurm/common.sh checks
with it that zerompi imports).
"""
import os
import sys
from contextlib import contextmanager

if sys.argv[1:2] == ["-c"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])

from mpi4py import MPI  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

import zerompi.comm  # noqa: E402
import zerompi.train.loop.run  # noqa: E402
from zerompi.train.options.device_choice import local_rank  # noqa: E402

args = sys.argv[1:]
if args[:2] == ["-m", "zerompi.train"]:
    args = args[2:]
seen = {}
real_ranks_on_this_node = zerompi.comm.Communicator.ranks_on_this_node
real_threadpool_limits = zerompi.train.loop.run.threadpool_limits


def ranks_on_this_node(self):
    seen["ranks on node"] = real_ranks_on_this_node(self)
    return seen["ranks on node"]


@contextmanager
def threadpool_limits_then_report(limits):
    with real_threadpool_limits(limits=limits) as limited:
        blas = sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        world = MPI.COMM_WORLD
        print(f"placement: rank {world.Get_rank()} of {world.Get_size()} on {MPI.Get_processor_name()}: "
              f"local rank {local_rank(os.environ)}, {seen['ranks on node']} ranks on its node, "
              f"{','.join(map(str, blas))} BLAS threads", file=sys.stderr, flush=True)
        yield limited


zerompi.comm.Communicator.ranks_on_this_node = ranks_on_this_node
zerompi.train.loop.run.threadpool_limits = threadpool_limits_then_report
sys.exit(zerompi.train.loop.run.main(args))
