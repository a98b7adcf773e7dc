"""`python -m zerompi.plan`: which ZeRO stage fits, and how fast each runs, before running any.

    mpirun -n N python -m zerompi.plan calibrate --out machine.json [--offload-dir DIR]
        measure this machine's limits at N ranks (zerompi/train/commands/calibrate.py), about 10 s;
        with --offload-dir, the file tier's rates in DIR too

    python -m zerompi.plan --calibration machine.json --ranks N --hidden 2048,2048 [run options]
    python -m zerompi.plan --gemm-gflops 300 --mem-bandwidth-gbs 20 --intra-bandwidth-gbs 50
        --intra-latency-us 2 [--inter-bandwidth-gbs 12 --inter-latency-us 5 --ranks-per-node 8]
        --ranks N --params 7e8 [run options]
        one row per stage (and hybrid sharding and hpZ when the ranks span several nodes, stage 3
        with the optimizer state, then the parameters too, in a file where the calibration measured
        an offload folder): memory
        per rank (what the run's preflight will ask for, zerompi/plan/preflight.py), whether it
        fits, and the predicted step time in its parts (zerompi/train/commands/cost.py); then the fastest
        stage that fits.

Bad flags or a bad calibration file: one line, `zerompi: error: ...`, exit status 2; a calibration
during which other processes took more than --others-limit of the machine: one line, no file, 9.
"""
import argparse
import math
import os
import sys

from ...util.exit_codes import ExitCode
from ...hierarchy import FLAT, Grouping
from ...util.inputs import available_bytes, format_bytes, printable
from ...util.other_processes import OTHERS_LIMIT, busy_reason
from ...memory import model_size_error
from ...offload import FileTier
from .memory_table import OneLineParser, non_negative_float, parameter_count, positive_float, rank_count
from ...overlap import OverlapConfig
from ...util.pipes import until_reader_leaves
from ...precision import DTYPE_NAMES, precision_for
from ...util.words import counted
from ...plan import RunShape, plan_run
from .calibrate import CalibrationError, read_calibration
from .cost import CostError, cluster_machine, page_cache_left, step_cost
from ...plan.preflight import need_bytes

DIGITS_FEATURES, DIGITS_CLASSES = 64, 10           # the default data set's (--data digits)
CLUSTER_FLAGS = ("gemm_gflops", "mem_bandwidth_gbs", "intra_bandwidth_gbs", "intra_latency_us")


def _widths(text):
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"widths must be >= 1, got {text!r}")
    return widths


def predict_parser():
    p = OneLineParser(prog="python -m zerompi.plan",
                description="Predict memory per rank and step time of ZeRO stages 0-3 for a run, from this "
                            "machine's calibration or a cluster's numbers, and name the fastest stage that "
                            "fits. `mpirun -n N python -m zerompi.plan calibrate --out FILE` measures this "
                            "machine (see `python -m zerompi.plan calibrate --help`).")
    m = p.add_argument_group("the machine: a calibration file, or a cluster's numbers (per rank)")
    m.add_argument("--calibration", metavar="FILE", help="written by `python -m zerompi.plan calibrate`")
    m.add_argument("--gemm-gflops", type=positive_float, help="GEMM rate of one rank, GFLOP/s")
    m.add_argument("--mem-bandwidth-gbs", type=positive_float, help="memory bandwidth of one rank, GB/s")
    m.add_argument("--intra-bandwidth-gbs", type=positive_float, help="bandwidth between ranks of a node, GB/s")
    m.add_argument("--intra-latency-us", type=non_negative_float, help="latency between ranks of a node, us")
    m.add_argument("--inter-bandwidth-gbs", type=positive_float, help="bandwidth between nodes, GB/s per rank")
    m.add_argument("--inter-latency-us", type=non_negative_float, help="latency between nodes, us")
    m.add_argument("--ranks-per-node", type=rank_count, help="ranks on each node (default: all on one)")
    m.add_argument("--memory-per-rank-gb", type=positive_float,
                   help="memory each rank may use (default: this machine's available memory shared by the "
                        "ranks of a node)")
    r = p.add_argument_group("the run")
    r.add_argument("--ranks", type=rank_count, default=1, help="N, ranks in all (default 1)")
    r.add_argument("--hidden", type=_widths, help="hidden layer widths, comma-separated")
    r.add_argument("--params", type=parameter_count, metavar="PSI",
                   help="instead of --hidden: --layers hidden layers of the width that reaches PSI parameters")
    r.add_argument("--layers", type=rank_count, default=4, help="hidden layers for --params (default 4)")
    r.add_argument("--features", type=rank_count, default=DIGITS_FEATURES,
                   help=f"input width (default {DIGITS_FEATURES}, the digits data set's)")
    r.add_argument("--classes", type=rank_count, default=DIGITS_CLASSES,
                   help=f"output width (default {DIGITS_CLASSES}, the digits data set's)")
    r.add_argument("--batch-size", type=rank_count, help="global batch: rows per step over all ranks")
    r.add_argument("--micro-batch-size", type=rank_count, help="rows per rank in each micro-batch")
    r.add_argument("--grad-accum", type=rank_count, help="micro-batches per step (default 1)")
    r.add_argument("--dtype", default="float32", choices=tuple(DTYPE_NAMES), metavar="{float32,float64,bf16,fp16}")
    r.add_argument("--overlap", action="store_true", help="the collectives on a communication thread")
    return p


def calibrate_parser():
    p = OneLineParser(prog="python -m zerompi.plan calibrate",
                description="Measure this machine's limits for the cost model at N ranks (run it under "
                            "`mpirun -n N`): GEMM rates, memory bandwidth, AdamW per element, Python's "
                            "overhead per layer, and the collectives at N (about 10 s at N = 2). Each is "
                            "timed several times and the best kept.")
    p.add_argument("--out", required=True, metavar="FILE", help="the calibration file to write (JSON)")
    p.add_argument("--offload-dir", metavar="DIR",
                   help="also measure the file tier's rates in this folder (a scratch file of 64 MiB per rank, "
                        "written synced and from the page cache; removed however the calibration ends)")
    p.add_argument("--others-limit", type=non_negative_float, default=OTHERS_LIMIT, metavar="SHARE",
                   help="the calibration is void, and writes no file (exit status 9), if other processes took "
                        f"more than this share of the machine's CPU while it measured (default {OTHERS_LIMIT})")
    return p


def check_args(parser, args):
    cluster = [getattr(args, name) is not None for name in CLUSTER_FLAGS]
    if args.calibration and any(cluster):
        parser.error("give --calibration or the cluster's numbers, not both")
    if not args.calibration and not all(cluster):
        parser.error("give --calibration FILE, or the cluster's numbers: "
                     + " ".join("--" + name.replace("_", "-") for name in CLUSTER_FLAGS))
    if (args.inter_bandwidth_gbs is None) != (args.inter_latency_us is None):
        parser.error("--inter-bandwidth-gbs and --inter-latency-us go together")
    if args.ranks_per_node and args.ranks % args.ranks_per_node:
        parser.error(f"--ranks-per-node {args.ranks_per_node} does not divide --ranks {args.ranks}")
    several_nodes = args.ranks_per_node and args.ranks > args.ranks_per_node
    if several_nodes and args.calibration:
        parser.error("a calibration measures one node: give the cluster's numbers for several nodes")
    if several_nodes and args.inter_bandwidth_gbs is None:
        parser.error(f"{args.ranks // args.ranks_per_node} nodes need --inter-bandwidth-gbs and --inter-latency-us")
    if args.hidden and args.params:
        parser.error("give --hidden or --params, not both")
    if not args.hidden and not args.params:
        parser.error("give the model: --hidden W1,W2,... or --params PSI")


def width_for(psi, layers, features, classes):
    """The width W of `layers` hidden layers with the parameter count nearest psi:
    (F+1) W + (L-1)(W+1) W + (W+1) C = psi, solved for W."""
    a, b, c = layers - 1, features + 1 + layers - 1 + classes, classes - psi
    return round(-c / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))


def rows(args, parser):
    """(rows per rank in a micro-batch, micro-batches per step) from the batch options."""
    N, M = args.ranks, args.grad_accum or 1
    if args.batch_size is None:
        if args.micro_batch_size is None:
            parser.error("give the batch: --batch-size (rows per step, all ranks) or --micro-batch-size "
                         "(rows per rank)")
        return args.micro_batch_size, M
    if args.batch_size % (N * M):
        parser.error(f"--batch-size {args.batch_size} does not split into {M} micro-batches on {N} ranks")
    micro = args.batch_size // (N * M)
    if args.micro_batch_size not in (None, micro):
        parser.error(f"--batch-size {args.batch_size} is {micro} rows per rank and micro-batch on {N} ranks, "
                     f"not --micro-batch-size {args.micro_batch_size}")
    return micro, M


def variants(args, machine):
    """(name, stage, grouping, offload tiers) of each row: stages 0-3, hybrid sharding and hpZ on
    several nodes, and stage 3 with the file tier where the machine's offload folder was measured."""
    rows = [(f"stage {s}", s, FLAT, {}) for s in range(4)]
    L = args.ranks_per_node
    if L and args.ranks > L:
        rows += [(f"stage 3 hybrid S={L}", 3, Grouping(shard_group=L), {}),
                 (f"stage 3 hpZ L={L}", 3, Grouping(hpz_node_size=L), {})]
    if machine.files is not None:
        rows += [("stage 3 opt file", 3, FLAT, {"offload": FileTier(None, 0)}),
                 ("stage 3 opt+par file", 3, FLAT, {"offload": FileTier(None, 0), "offload_params": FileTier(None, 0)})]
    return rows


def predict(args, parser):
    if args.calibration:
        machine = read_calibration(args.calibration)
    else:
        inter = None if args.inter_bandwidth_gbs is None else (args.inter_bandwidth_gbs, args.inter_latency_us)
        machine = cluster_machine(args.gemm_gflops, args.mem_bandwidth_gbs,
                                  (args.intra_bandwidth_gbs, args.intra_latency_us), inter)
    hidden = args.hidden
    if args.params:
        width = width_for(args.params, args.layers, args.features, args.classes)
        if width < 1:
            parser.error(f"--params {args.params:g} is fewer than {args.layers} hidden layers of width 1 have")
        hidden = (width,) * args.layers
    sizes = (args.features, *hidden, args.classes)
    if model_size_error(sizes):
        parser.error(model_size_error(sizes))
    micro, accum = rows(args, parser)
    N, L = args.ranks, args.ranks_per_node or args.ranks
    node_of_rank = tuple(r // L for r in range(N))
    precision = precision_for(args.dtype)
    available = (args.memory_per_rank_gb * 1e9 if args.memory_per_rank_gb else available_bytes(L))
    shape = RunShape(sizes, 0, precision, micro, N, accum, FLAT, OverlapConfig(enabled=args.overlap), node_of_rank)
    rows_out = []
    for name, stage, grouping, tiers in variants(args, machine):
        s = RunShape(sizes, stage, precision, micro, N, accum, grouping, shape.overlap, node_of_rank,
                     watchdog=True, **tiers)           # watchdog: zerompi.train's default --collective-timeout
        memory = max(need_bytes(s, rank) for rank in {0, N - 1})   # what the run's preflight asks for
        page_cache = page_cache_left(available, memory, L)
        rows_out.append((name, memory, step_cost(plan_run(s), machine, page_cache)))
        if not math.isfinite(rows_out[-1][2].step_s):     # a machine of 1e308 s overheads, say
            parser.error(f"{name}'s predicted step time overflows ({rows_out[-1][2].step_s}): the machine's "
                         f"numbers are not a machine's")
    print(f"MLP {'-'.join(map(str, sizes))} ({shape.num_params:,} params, {precision.name}) | {counted(N, 'rank')}"
          f"{f', {L} per node' if L < N else ''} | {counted(micro, 'row')} per rank x {counted(accum, 'micro-batch')} | "
          f"overlap "
          f"{'on' if args.overlap else 'off'}")
    print(f"machine: {args.calibration or 'the cluster numbers given'} | memory per rank: "
          f"{format_bytes(available) if available else 'unknown'}")
    print(f"{'':20} {'needs/rank':>11} {'fits':>4} | {'compute':>8} {'elemwise':>8} {'optim':>8} {'overhead':>8} "
          f"{'comm':>8} {'hidden':>8} {'offload':>8} | {'step ms':>8}")
    best = None
    for name, memory, cost in rows_out:
        fits = available is None or memory <= available
        ms = [1e3 * t for t in (cost.compute_s, cost.elementwise_s, cost.optimizer_s, cost.overhead_s,
                                cost.comm_s, cost.hidden_s, cost.offload_s, cost.step_s)]
        print(f"{name:20} {format_bytes(memory):>11} {'yes' if fits else 'no':>4} | "
              + " ".join(f"{t:8.1f}" for t in ms[:-1]) + f" | {ms[-1]:8.1f}")
        if fits and (best is None or cost.step_s < best[1].step_s):
            best = (name, cost, memory)
    if best is None:
        print(f"no stage fits in {format_bytes(available)} per rank: use more ranks or a smaller model")
    else:
        print(f"fastest that fits: {best[0]} ({1e3 * best[1].step_s:.1f} ms per step, {format_bytes(best[2])} per rank)")


def calibrate_main(argv):
    args = calibrate_parser().parse_args(argv)
    from ...checkpoint.weights import check_writable
    from ...mpi import init_mpi
    from ...mpi import MPI, MpiUnavailable, launcher_rank
    from .calibrate import calibrate, write_calibration
    try:
        init_mpi()
    except MpiUnavailable as e:                 # no MPI to agree over: the launcher's rank 0 says why
        if launcher_rank(os.environ) == 0:
            print(f"zerompi: error: {printable(str(e))}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    error = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        error = check_writable(args.out, "the calibration")
        if error is None and args.offload_dir is not None and not os.path.isdir(args.offload_dir):
            error = f"--offload-dir {args.offload_dir} is not a folder"
    if MPI.COMM_WORLD.bcast(error):               # before a minute of measuring: the output must be a file
        if error:
            print(f"zerompi: error: {printable(error)}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        result = calibrate(args.offload_dir)
    except CalibrationError as e:                 # every rank raises it: rank 0 says it
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"zerompi: error: {printable(str(e))}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    share, void = result["others_share"], busy_reason(result["others_share"], args.others_limit)
    if void:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"zerompi: error: the calibration is void: {void}; no file written", file=sys.stderr)
        return ExitCode.MEASUREMENT_VOID
    error = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        try:
            write_calibration(result, args.out)
            print(f"wrote {args.out}: {result['ranks']} ranks, measured in {result['seconds']:.1f} s; other processes: "
                  + ("unknown (no /proc/stat)" if share is None else f"{100 * share:.1f}% of the machine's CPU"))
        except OSError as e:
            error = printable(f"zerompi: error: cannot write {args.out}: {e.strerror}")
            print(error, file=sys.stderr)
    return ExitCode.BAD_INPUT if MPI.COMM_WORLD.bcast(error) else ExitCode.OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    parser = predict_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    try:
        predict(args, parser)
    except (CalibrationError, CostError) as e:
        parser.error(str(e))
    return ExitCode.OK


def command():
    """The exit status of `python -m zerompi.plan` (zerompi/plan/__main__.py): `| head` ends it quietly."""
    return until_reader_leaves(main) or 0
