"""The cost model (zerompi/train/commands/cost.py) against measured step times, on this machine.

    mpirun -n N python benchmarks/plan_accuracy.py [--widths 512,1024,2048,4096] [--layers 4]
        [--batch-per-rank 64] [--stages 0,1,2,3] [--repeats 5] [--steps 3] [--warmup 2]

For each width W, an MLP W-W-...-W-10 (`layers` linear layers, float32, overlap off): its stages'
engines warmed up, then `repeats` rounds, each of which calibrates (zerompi/train/commands/calibrate.py, as
`python -m zerompi.plan calibrate` does, at this N) and then times `steps` steps of every stage
(step_time.py's timed_repeats: the slowest rank's mean), with the BLAS threads a run would use
(zerompi/cpu.py). Each round's prediction (plan_run's calls priced by step_cost with that
round's calibration) over that round's measured step is its ratio: prediction and measurement
side by side, so that the machine's drift over minutes (measured here: the same step's best time
30% apart in runs an hour apart) cancels. Printed per width and stage: the medians over the
rounds of each part of the prediction, of the prediction and of the measured step, and the
median, lowest and highest of the rounds' ratios (predicted / measured). One N per run; N above
the cores shares them (the calibration then measures the shared cores too).
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
from zerompi.train.commands.calibrate import calibrate, machine_from            # noqa: E402
from zerompi.train.commands.cost import step_cost                               # noqa: E402
from zerompi.precision import precision_for                           # noqa: E402
from zerompi.cpu import blas_threads                          # noqa: E402

PRECISION = precision_for("float32")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="512,1024,2048,4096")
    p.add_argument("--layers", type=int, default=4, help="linear layers: W x (layers - 1) hidden, then 10 classes")
    p.add_argument("--batch-per-rank", type=int, default=64)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    args.stages = [int(s) for s in args.stages.split(",")]
    return args


def warmed_steps(sizes, args):
    """stage -> one training step of a warmed-up engine of that stage."""
    steps = {}
    for stage in args.stages:
        engine = build_engine(sizes, stage, PRECISION, AdamConfig(), args.batch_per_rank)
        steps[stage] = warmed_up_step(engine, SimpleNamespace(batch_per_rank=args.batch_per_rank, sizes=sizes,
                                                              warmup=args.warmup))
    return steps


def rounds_of(sizes, args):
    """stage -> [(cost, measured seconds)] per round: each round calibrates, then times every
    stage once, so that a round's prediction and its measurement see the machine alike."""
    steps = warmed_steps(sizes, args)
    plans = {stage: plan_run(RunShape(tuple(sizes), stage, PRECISION, args.batch_per_rank, N)) for stage in steps}
    rounds, calibrating = {stage: [] for stage in steps}, 0.0
    for _ in range(args.repeats):
        calibration = calibrate()
        calibrating += calibration["seconds"]
        machine = machine_from(calibration)
        for stage, step in steps.items():
            rounds[stage].append((step_cost(plans[stage], machine), timed_repeats(step, 1, args.steps, 0)[0]))
    return rounds, calibrating


def main(argv=None):
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    threads = blas_threads(N, os.environ, cores)          # all ranks on this node
    rows, calibrating = [], 0.0
    with threadpool_limits(limits=threads):
        for width in args.widths:
            rounds, seconds = rounds_of([width] * args.layers + [10], args)
            calibrating += seconds
            rows += [(width, stage, r) for stage, r in rounds.items()]
    if RANK != 0:
        return
    print(f"plan accuracy | {N} rank{'s' if N > 1 else ''} on {cores} cores"
          f"{' (ranks share cores)' if N > cores else ''} x {threads} BLAS thread{'s' if threads > 1 else ''} | "
          f"MLP W x {args.layers - 1} hidden + 10, float32, {args.batch_per_rank} rows per rank | "
          f"{args.repeats} rounds of: calibrate ({calibrating / args.repeats / len(args.widths):.1f} s), "
          f"then {args.steps} steps of each stage | ms, medians over the rounds")
    print(f"{'W':>5} {'stage':>5} | {'compute':>8} {'elemwise':>8} {'optim':>8} {'overhead':>8} {'comm':>8} | "
          f"{'predicted':>9} {'measured':>8} | {'ratio':>6} {'lowest':>6} {'highest':>7}")
    for width, stage, r in rows:
        def median(part):
            return 1e3 * statistics.median(getattr(cost, part) for cost, _ in r)
        parts = ("compute_s", "elementwise_s", "optimizer_s", "overhead_s", "comm_s")
        ratios = [cost.step_s / seconds for cost, seconds in r]
        print(f"{width:5} {stage:5} | " + " ".join(f"{median(part):8.1f}" for part in parts)
              + f" | {median('step_s'):9.1f} {1e3 * statistics.median(t for _, t in r):8.1f}"
              f" | {statistics.median(ratios):6.2f} {min(ratios):6.2f} {max(ratios):7.2f}")


if __name__ == "__main__":
    main()
