"""Run zerompi.train and count the trace events each rank holds in memory (tests/program/test_observability.py).

    mpirun -n N python tests/support/trace_driver.py [zerompi.train flags, with --trace]

Before every step, the number of events this rank's Tracer holds is noted; at the end each rank
prints `rank R held at most E trace events` (E: the largest count). The training is the real one.
"""
import sys

from mpi4py import MPI

import zerompi.train.loop.run

real_start_trace = zerompi.train.loop.run.start_trace
real_train_step = zerompi.train.loop.run.train_step
tracers, most_held = [], [0]


def start_trace(*args):
    tracer = real_start_trace(*args)
    tracers.append(tracer)
    return tracer


def train_step(*args, **kwargs):
    most_held[0] = max(most_held[0], len(tracers[0].events))
    return real_train_step(*args, **kwargs)


zerompi.train.loop.run.start_trace = start_trace
zerompi.train.loop.run.train_step = train_step
try:
    status = zerompi.train.loop.run.main(sys.argv[1:])
finally:
    print(f"rank {MPI.COMM_WORLD.Get_rank()} held at most {most_held[0]} trace events", flush=True)
sys.exit(status)
