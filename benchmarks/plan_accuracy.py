"""The cost model (zerompi/train/commands/cost.py) against measured step times, on this machine.

    mpirun -n N python benchmarks/plan_accuracy.py [--widths 512,1024,2048,4096] [--layers 4]
        [--batch-per-rank 64] [--stages 0,1,2,3] [--repeats 5] [--steps 3] [--warmup 2]
        [--offload-dir DIR]

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

With --offload-dir DIR, two more rows per width at stage 3 (zerompi/offload/): `3 opt` with the
optimizer state in a file in DIR, `3 o+p` with the parameter shard in one too; the calibration
measures DIR's rates, and the prediction prices the files at the page cache's rates when the
node's files fit in the memory left free (available_bytes less each rank's need), else the disk's.
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
from zerompi.offload import FileTier, OffloadedAdamConfig, OffloadedStage3   # noqa: E402
from zerompi.plan.preflight import need_of                           # noqa: E402
from zerompi.util.inputs import available_bytes                      # noqa: E402
from zerompi.plan import RunShape, plan_run                           # noqa: E402
from zerompi.train.commands.calibrate import calibrate, machine_from            # noqa: E402
from zerompi.train.commands.cost import page_cache_left, step_cost                               # noqa: E402
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
    p.add_argument("--offload-dir", help="add stage 3 rows with the file tier in this folder")
    args = p.parse_args(argv)
    args.widths = [int(w) for w in args.widths.split(",")]
    args.stages = [int(s) for s in args.stages.split(",")]
    return args


def variants(args):
    """(row name, stage, the RunShape's offload fields) of each row."""
    rows = [(str(stage), stage, {}) for stage in args.stages]
    if args.offload_dir:
        rows += [("3 opt", 3, {"offload": FileTier(args.offload_dir, RANK)}),
                 ("3 o+p", 3, {"offload": FileTier(args.offload_dir, RANK),
                               "offload_params": FileTier(args.offload_dir, RANK)})]
    return rows


def warmed_step(sizes, stage, tiers, args):
    """One training step of a warmed-up engine of that stage and tiers."""
    adam = (OffloadedAdamConfig(tier=tiers["offload"], param_tier=tiers.get("offload_params"))
            if tiers else AdamConfig())
    engine = build_engine(sizes, stage, PRECISION, adam, args.batch_per_rank,
                          stage_class=OffloadedStage3 if "offload_params" in tiers else None)
    return warmed_up_step(engine, SimpleNamespace(batch_per_rank=args.batch_per_rank, sizes=sizes,
                                                  warmup=args.warmup))


def rounds_of(sizes, args):
    """row -> [(cost, measured seconds)] per round: each round calibrates, then times every
    row once, so that a round's prediction and its measurement see the machine alike."""
    rows = variants(args)
    steps = {name: warmed_step(sizes, stage, tiers, args) for name, stage, tiers in rows}
    plans = {name: plan_run(RunShape(tuple(sizes), stage, PRECISION, args.batch_per_rank, N, **tiers))
             for name, stage, tiers in rows}
    available = available_bytes(N)
    page_cache = {name: page_cache_left(available, need_of(plan), N) for name, plan in plans.items()}
    rounds, calibrating = {name: [] for name in steps}, 0.0
    for _ in range(args.repeats):
        calibration = calibrate(args.offload_dir)
        calibrating += calibration["seconds"]
        machine = machine_from(calibration)
        for name, step in steps.items():
            rounds[name].append((step_cost(plans[name], machine, page_cache[name]),
                                 timed_repeats(step, 1, args.steps, 0)[0]))
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
            rows += [(width, name, r) for name, r in rounds.items()]
    if RANK != 0:
        return
    print(f"plan accuracy | {N} rank{'s' if N > 1 else ''} on {cores} cores"
          f"{' (ranks share cores)' if N > cores else ''} x {threads} BLAS thread{'s' if threads > 1 else ''} | "
          f"MLP W x {args.layers - 1} hidden + 10, float32, {args.batch_per_rank} rows per rank | "
          f"{args.repeats} rounds of: calibrate ({calibrating / args.repeats / len(args.widths):.1f} s), "
          f"then {args.steps} steps of each stage | ms, medians over the rounds")
    print(f"{'W':>5} {'stage':>5} | {'compute':>8} {'elemwise':>8} {'optim':>8} {'overhead':>8} {'comm':>8} "
          f"{'offload':>8} | {'predicted':>9} {'measured':>8} | {'ratio':>6} {'lowest':>6} {'highest':>7}")
    for width, name, r in rows:
        def median(part):
            return 1e3 * statistics.median(getattr(cost, part) for cost, _ in r)
        parts = ("compute_s", "elementwise_s", "optimizer_s", "overhead_s", "comm_s", "offload_s")
        ratios = [cost.step_s / seconds for cost, seconds in r]
        print(f"{width:5} {name:>5} | " + " ".join(f"{median(part):8.1f}" for part in parts)
              + f" | {median('step_s'):9.1f} {1e3 * statistics.median(t for _, t in r):8.1f}"
              f" | {statistics.median(ratios):6.2f} {min(ratios):6.2f} {max(ratios):7.2f}")


if __name__ == "__main__":
    main()
