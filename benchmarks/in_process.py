"""Step time of N ranks in one process (threads, zerompi/inprocess/) against mpirun's N processes.

    python benchmarks/in_process.py                       # N = 1, 2, 4; stage 3; MLP 256-512-512-10
    python benchmarks/in_process.py --ranks 2,4 --stage 1 --hidden 1024,1024 --rounds 5

Method: each round, for each N, side by side: `mpirun -n N python benchmarks/in_process.py
--worker` (N processes, one BLAS thread each), then the same steps on N in-process ranks in this
process (one BLAS thread per call: the pool is shared). Each times `--steps` train_steps after
`--warmup` (a barrier before each, float32, random rows per rank) and reports the median step,
the maximum over ranks. Printed: the medians over rounds, the in-process / mpirun ratio, the
CPU and the BLAS. The threads share the interpreter lock outside NumPy's kernels: the ratio says
what that costs at this size.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from zerompi.adam import AdamConfig  # noqa: E402
from zerompi.engine import build_engine  # noqa: E402
from zerompi.inprocess import run_ranks  # noqa: E402
from zerompi.precision import precision_for  # noqa: E402
from zerompi.step import train_step  # noqa: E402
from machine import blas_kernels, cpu_model  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1,2,4", help="comma list of N (default: %(default)s)")
    p.add_argument("--stage", type=int, default=3, choices=range(4))
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--rows", type=int, default=32, help="rows per rank per step (default: %(default)s)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", action="store_true", help="(internal) one MPI rank of a round")
    return p.parse_args(argv)


def median_step(comm, args):
    """This rank's median step time over --steps timed train_steps."""
    sizes = [256, *map(int, args.hidden.split(",")), 10]
    engine = build_engine(sizes, args.stage, precision_for("float32"), AdamConfig(), args.rows, comm)
    engine.init_params(0)
    rng = np.random.default_rng(comm.rank)
    batch = [(rng.standard_normal((args.rows, sizes[0])).astype(np.float32), rng.integers(0, 10, args.rows))]
    times = []
    for step in range(args.warmup + args.steps):
        comm.barrier()
        start = time.perf_counter()
        train_step(engine, batch, args.rows * comm.size, 1e-3)
        times.append(time.perf_counter() - start)
    return statistics.median(times[args.warmup:])


def worker(args):
    from zerompi.comm import Communicator
    from zerompi.mpi import MPI
    comm = Communicator()
    with threadpool_limits(limits=1):
        mine = median_step(comm, args)
    longest = comm.mpi.allreduce(mine, op=MPI.MAX)
    if comm.rank == 0:
        print(json.dumps({"step_s": longest}))


def mpirun_step(n, argv):
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    result = subprocess.run([mpirun if os.path.exists(mpirun) else "mpirun", "-n", str(n), sys.executable,
                             os.path.abspath(__file__), "--worker", *argv], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"mpirun -n {n} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["step_s"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    forwarded = [a for a in argv if a != "--worker"]
    times = {n: {"mpirun": [], "in-process": []} for n in map(int, args.ranks.split(","))}
    for _ in range(args.rounds):
        for n in times:
            times[n]["mpirun"].append(mpirun_step(n, forwarded))
            with threadpool_limits(limits=1):
                times[n]["in-process"].append(max(run_ranks(lambda comm: median_step(comm, args), n)))
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')} | {cpu_model()}, {os.cpu_count()} CPUs | BLAS {blas_kernels()} | "
          f"stage {args.stage}, MLP 256-{args.hidden.replace(',', '-')}-10, {args.rows} rows per rank, float32 | "
          f"median of {args.rounds} rounds x {args.steps} steps")
    print(f"{'N':>3} {'mpirun ms':>10} {'in-process ms':>14} {'ratio':>6}")
    for n, runs in times.items():
        mpi, threads = (statistics.median(runs[k]) * 1e3 for k in ("mpirun", "in-process"))
        print(f"{n:>3} {mpi:>10.2f} {threads:>14.2f} {threads / mpi:>6.2f}")


if __name__ == "__main__":
    main()
