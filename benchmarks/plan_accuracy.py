"""The cost model (zerompi/plan/cost.py) against measured step times, on this machine.

    mpirun -n N python benchmarks/plan_accuracy.py [--widths 512,1024,2048,4096] [--layers 4]
        [--batch-per-rank 64] [--stages 0,1,2,3] [--repeats 7] [--steps 3] [--warmup 2]

Calibrates first (zerompi/plan/calibrate.py, as `python -m zerompi.plan calibrate` does, at this
N), then for each width W an MLP W-W-...-W-10 (`layers` linear layers, float32, overlap off) and
each stage: the predicted step (plan_run's calls priced by step_cost) beside the measured one,
with the BLAS threads a run would use (zerompi/devices/cpu.py). Measured: step_time.py's
warmed_up_step and timed_repeats, the stages of a width in interleaved rounds; each round's time is
the slowest rank's mean of `steps` steps; printed are the median round and the best one (the
calibration too keeps each limit's best sample). ratio = predicted / measured. One N per run; N
above the cores shares them (the calibration then measures the shared cores too).
"""
import argparse
import os
import statistics
import sys
from types import SimpleNamespace

from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from step_time import N, RANK, timed_repeats, warmed_up_step   # noqa: E402
from zerompi.adam import AdamConfig                                    # noqa: E402
from zerompi.engine import build_engine                                # noqa: E402
from zerompi.plan import RunShape, plan_run                           # noqa: E402
from zerompi.plan.calibrate import calibrate, machine_from            # noqa: E402
from zerompi.plan.cost import step_cost                               # noqa: E402
from zerompi.precision import precision_for                           # noqa: E402
from zerompi.devices.cpu import blas_threads                          # noqa: E402

PRECISION = precision_for("float32")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="512,1024,2048,4096")
    p.add_argument("--layers", type=int, default=4, help="linear layers: W x (layers - 1) hidden, then 10 classes")
    p.add_argument("--batch-per-rank", type=int, default=64)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    args.stages = [int(s) for s in args.stages.split(",")]
    return args


def measure(sizes, args):
    """stage -> (median, best) seconds per step, the stages timed in interleaved rounds (a burst
    of load from elsewhere hits them alike)."""
    steps = {}
    for stage in args.stages:
        engine = build_engine(sizes, stage, PRECISION, AdamConfig(), args.batch_per_rank)
        steps[stage] = warmed_up_step(engine, SimpleNamespace(batch_per_rank=args.batch_per_rank, sizes=sizes,
                                                              warmup=args.warmup))
    rounds = {stage: [] for stage in args.stages}
    for _ in range(args.repeats):
        for stage, step in steps.items():
            rounds[stage].append(timed_repeats(step, 1, args.steps, 0)[0])
    return {stage: (statistics.median(r), min(r)) for stage, r in rounds.items()}


def main(argv=None):
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    threads = blas_threads(N, os.environ, cores)          # all ranks on this node
    calibration = calibrate()
    machine = machine_from(calibration)
    rows = []
    with threadpool_limits(limits=threads):
        for width in args.widths:
            sizes = [width] * args.layers + [10]
            measured = measure(sizes, args)
            for stage in args.stages:
                cost = step_cost(plan_run(RunShape(tuple(sizes), stage, PRECISION, args.batch_per_rank, N)), machine)
                rows.append((width, stage, cost, measured[stage]))
    if RANK != 0:
        return
    print(f"plan accuracy | {N} rank{'s' if N > 1 else ''} on {cores} cores"
          f"{' (ranks share cores)' if N > cores else ''} x {threads} BLAS thread{'s' if threads > 1 else ''} | "
          f"MLP W x {args.layers - 1} hidden + 10, float32, {args.batch_per_rank} rows per rank | "
          f"calibrated in {calibration['seconds']:.1f} s | measured: median of {args.repeats} x {args.steps} steps")
    print(f"{'W':>5} {'stage':>5} | {'compute':>8} {'elemwise':>8} {'optim':>8} {'overhead':>8} {'comm':>8} | "
          f"{'predicted':>9} {'median':>8} {'ratio':>6} {'best':>8} {'ratio':>6}")
    for width, stage, cost, (median, best) in rows:
        parts = (cost.compute_s, cost.elementwise_s, cost.optimizer_s, cost.overhead_s, cost.comm_s)
        print(f"{width:5} {stage:5} | " + " ".join(f"{1e3 * t:8.1f}" for t in parts)
              + f" | {1e3 * cost.step_s:9.1f} {1e3 * median:8.1f} {cost.step_s / median:6.2f}"
              f" {1e3 * best:8.1f} {cost.step_s / best:6.2f}")



if __name__ == "__main__":
    main()
