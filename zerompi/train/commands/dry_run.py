"""--dry-run: the plan of a run, printed without training, without MPI (zerompi/plan/).

    python -m zerompi.train --dry-run --ranks 4 [--ranks-per-node L] [the run's flags]
    mpirun -n 4 python -m zerompi.train --dry-run [the run's flags]     N = the launcher's size

The flags, config file and data are read and checked as the run reads them (one line, exit 2 on a
problem). Then, for the chosen stage and every other stage side by side (and the chosen
hierarchical variant): each rank's bytes by kind, from the run's own build_engine on buffers that
take no memory, and one step's collectives (calls, ring volume by purpose, inter-node volume),
from the stage's hooks on a communicator that moves nothing: exactly what the run's ledgers will
count (tests/reference/test_plan_equals_ledger.py). Each beside its formula (zerompi.memory). Last, the
preflight's verdict against this machine's memory (zerompi/plan/preflight.py) and the chosen
run's collectives call by call. Exit 0 (a plan that does not fit here is still a plan).

N is --ranks, else the launcher's size (PMI_SIZE, OMPI_COMM_WORLD_SIZE, ...: zerompi/train/options/launch.py),
and only the launcher's rank 0 prints. Ranks per node: --ranks-per-node, else the launcher's
(MPI_LOCALNRANKS, OMPI_COMM_WORLD_LOCAL_SIZE: zerompi/train/options/launch.py), else all N on one node; ranks are placed in blocks.
The plan is of the CPU path (a GPU run's preflight plans its own device's buffers).
"""
import sys
import textwrap

from ..options.config import _Parser, add_planning_flags, parse_args
from ..options.config_checks import check_config
from ..loop.data import load_data
from ..loop.in_process import in_process_error
from ..loop.offload_folder import numba_error
from ..options.before_mpi import choices_before_mpi
from ..options.errors import ArgumentError
from ..options.grouping import grouping_error, resolve_grouping
from ..options.shape import run_shape
from ..options.launch import LAUNCHER_LOCAL_SIZE_VARIABLES, LAUNCHER_SIZE_VARIABLES
from ...cpu import CPU
from ...util.exit_codes import ExitCode
from ...util.inputs import printable
from ...ledger import ALLGATHER, ALLREDUCE, ALLTOALL, FILE, GRADS, METRICS, MEMORY_KINDS, PARAMS, REDUCE_SCATTER
from ...quantize import QUANT_ERROR, SCALES
from ...memory import MOST_RANKS, model_size_error, ring_traffic
from ...mpi import first_number, launcher_rank
from ...util.pipes import until_reader_leaves
from ...plan import plan_run
from ...plan.preflight import describe, flat_at, need_of, preflight_error, runtime_bytes, start_transient_bytes
from ...plan.virtual import PlannedCommunicator
from ...util.words import counted, format_bytes

OP_NAMES = {ALLREDUCE: "all-reduce", REDUCE_SCATTER: "reduce-scatter", ALLGATHER: "all-gather", ALLTOALL: "all-to-all"}


def answer_dry_run(argv, environ, out=sys.stdout):
    """With --dry-run: the plan printed by the launcher's rank 0, exit 0 (a problem: one line,
    exit 2). Without it: returns (--ranks or --ranks-per-node without it: one line, exit 2).
    Called before MPI starts."""
    peek = _Parser(rank=None, add_help=False, allow_abbrev=False)
    add_planning_flags(peek)
    try:
        args = peek.parse_known_args(argv)[0]
    except ArgumentError:
        return                                   # the full parse reports it
    rank = launcher_rank(environ)
    try:
        if not args.dry_run:
            if args.ranks is not None or args.ranks_per_node is not None:
                raise ArgumentError("--ranks and --ranks-per-node plan a run with --dry-run; a run has "
                                    "the launcher's ranks")
            return
        text = dry_run_text(argv, environ, args.ranks, args.ranks_per_node)
    except ArgumentError as e:
        if rank == 0:
            print(f"zerompi: error: {printable(str(e))}", file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.BAD_INPUT)
    if rank == 0:
        until_reader_leaves(lambda: print(printable(text, lines=True), file=out, flush=True))   # `--dry-run | head`
    raise SystemExit(ExitCode.OK)


def dry_run_text(argv, environ, ranks, ranks_per_node):
    early = choices_before_mpi(argv)          # --in-process-ranks N (--in-process-nodes M): those ranks
    if early.in_process_ranks and (ranks is not None or ranks_per_node is not None):
        raise ArgumentError("--ranks and --ranks-per-node plan a launch's ranks, --in-process-ranks and "
                            "--in-process-nodes their own: pass one pair")
    if early.in_process_ranks:
        error = in_process_error(early, environ)
        if error:
            raise ArgumentError(error)
        ranks, ranks_per_node = early.in_process_ranks, early.in_process_ranks // early.in_process_nodes
    num_ranks = ranks if ranks is not None else first_number(environ, LAUNCHER_SIZE_VARIABLES) or None
    if num_ranks is None:
        raise ArgumentError("--dry-run needs --ranks N (or a launcher that starts N processes)")
    if not 1 <= num_ranks <= MOST_RANKS:
        raise ArgumentError(f"--ranks must be in 1..{MOST_RANKS}, got {num_ranks}")
    per_node = ranks_per_node if ranks_per_node is not None else first_number(environ, LAUNCHER_LOCAL_SIZE_VARIABLES)
    per_node = per_node if ranks_per_node is not None or per_node else num_ranks
    if not 1 <= per_node <= num_ranks:
        raise ArgumentError(f"--ranks-per-node must be in 1..{num_ranks}, got {per_node}")
    cfg = parse_args(argv, 0, num_ranks)
    for error in (check_config(cfg, num_ranks), grouping_error(cfg, num_ranks), cfg.fused_adam and numba_error()):
        if error:
            raise ArgumentError(error)
    node_of_rank = tuple(r // per_node for r in range(num_ranks))
    grouping, error = resolve_grouping(cfg, PlannedCommunicator(num_ranks, 0, node_of_rank))
    data, data_error = load_data(cfg, min(per_node, num_ranks))
    if error or data_error:
        raise ArgumentError(error or data_error)
    sizes = [data.num_features, *cfg.hidden, cfg.classes or data.num_classes]
    if model_size_error(sizes):
        raise ArgumentError(model_size_error(sizes))
    chosen = run_shape(cfg, sizes, num_ranks, grouping, node_of_rank)      # the CPU path: host is no tier
    shown = [flat_at(chosen, stage) for stage in range(4)]     # at most 5 columns
    shown += [] if chosen in shown else [chosen]
    edge = per_node - 1                      # the last rank of node 0: its ring successor is on node 1
    return format_plans(chosen, [plan_run(shape) for shape in shown], [plan_run(shape, edge) for shape in shown],
                        per_node)


def format_plans(chosen, plans, edge_plans, per_node):
    """The dry run's text: rank 0's plans side by side (the chosen one starred), the inter-node
    bytes of the last rank of node 0 (edge_plans), the verdict here, the chosen run's calls."""
    s = chosen
    nodes = -(-s.num_ranks // per_node)
    lines = [f"zerompi dry run: MLP {'-'.join(map(str, s.sizes))} ({s.num_params:,} parameters), "
             f"{s.precision.name}",
             f"{counted(s.num_ranks, 'rank')} on {counted(nodes, 'node')}, {counted(s.rows, 'row')} per rank x "
             f"{counted(s.micro_batches, 'micro-batch')}"
             f"{', overlap' if s.overlap.enabled else ''}; * = the chosen run", ""]
    names = [describe(p.shape).replace("stage ", "st ").replace(" in groups of ", " S=")
             .replace(" with hpZ", " hpZ").replace(" with --offload-optimizer ", " ").replace(" --offload-params ", "+") + ("*" if p.shape == s else "") for p in plans]

    width = max(11, *(len(name) + 1 for name in names))

    def row(label, values):
        return f"{label:<20}" + "".join(f"{v:>{width}}" for v in values)

    lines.append(row("rank 0, memory", names))
    for kind in MEMORY_KINDS:
        lines.append(row(f"  {kind}", [format_bytes(p.bytes_by_kind[kind]) for p in plans]))
    lines.append(row("  start: init values", [format_bytes(start_transient_bytes(p.shape)) for p in plans]))
    lines.append(row("  MPI, threads, rest", [format_bytes(runtime_bytes(p)) for p in plans]))
    lines.append(row("  needs", [format_bytes(need_of(p)) for p in plans]))
    if any(p.shape.offload for p in plans):               # --offload-optimizer (zerompi/offload/)
        lines.append(row("  in a file", [format_bytes(p.tier_bytes(FILE)) for p in plans]))
    bpp = s.precision.bytes_per_param()
    formulas = [p.shape.grouping.model_state_bytes(p.shape.stage, s.num_params, s.num_ranks, bpp) for p in plans]
    formulas = [f["total"] - sum(f[kind] for kind in ("params", "optimizer") if p.bytes_by_kind[kind] == 0)
                for f, p in zip(formulas, plans)]    # less what is offloaded (zerompi/offload/)
    lines.append(row("  model state", [format_bytes(p.bytes_by_kind["params"] + p.bytes_by_kind["grads"] +
                                                    p.bytes_by_kind["optimizer"]) for p in plans]))
    lines.append(row("    formula at Psi", [format_bytes(f) for f in formulas]))
    lines += ["", row("rank 0, per step", names)]
    alltoall = (ALLTOALL,) if any(c.op == ALLTOALL for p in plans for c in p.calls) else ()   # --quantize-grads
    for op in (ALLREDUCE, REDUCE_SCATTER, ALLGATHER, *alltoall):
        lines.append(row(f"  {OP_NAMES[op]}s", [sum(c.op == op for c in p.calls) for p in plans]))
    scales = tuple(purpose for purpose in (SCALES, QUANT_ERROR)        # --quantize-*, --quant-error
                   if any(purpose in p.ledger.purposes() for p in plans))
    for purpose in (GRADS, PARAMS, *scales, METRICS):
        lines.append(row(f"  ring {purpose}", [format_bytes(p.ledger.totals({purpose})[1]) for p in plans]))
    edge = edge_plans[0].rank
    lines.append(row(f"  inter-node, rank {edge}", [format_bytes(p.ledger.inter_node({GRADS, PARAMS, METRICS,
                                                                                     *scales})[0])
                                                   for p in edge_plans]))
    lines.append(row("  ring elements", [_count(p.ledger.totals({GRADS, PARAMS})[2]) for p in plans]))
    lines.append(row("    formula at Psi", [_count(_comm_formula(p.shape)) for p in plans]))
    lines += ["", verdict(s, plans, per_node), "", f"the chosen run's collectives per step, in order ({describe(s)}):"]
    lines += _calls(next(p for p in plans if p.shape == s).calls)
    return "\n".join(lines)


def _count(n):
    """'454.42 M', '1,234'."""
    return f"{n / 1e6:,.2f} M" if n >= 1e6 else f"{n:,.0f}"


def _comm_formula(shape):
    """Ring elements per rank and step by zerompi.memory's formulas (rank 0's); qgZ's int4 gradients
    as the half as many bytes of their packed pairs."""
    kept = (shape.sizes[-2] + 1) * shape.sizes[-1] if shape.keep_last_layer else 0     # --keep-last-layer
    collectives = shape.grouping.ring_collectives(shape.stage, shape.num_params, shape.num_ranks, shape.micro_batches,
                                                  kept)
    rank0 = ring_traffic(collectives, shape.node_of_rank or (0,) * shape.num_ranks)[0]
    words = shape.grads_quantizer.bits / 8 if shape.grads_quantizer else 1
    return sum(n * (words if purpose == GRADS else 1) for link in ("intra", "inter") for purpose, n in rank0[link].items())


def verdict(chosen, plans, per_node):
    """This machine's memory against each plan, shared by the ranks of a node."""
    device = CPU()
    available, limit = device.memory_available(per_node)
    if available is None:
        return "this machine reports no memory limit: nothing to check the plans against"
    error = preflight_error(chosen, 0, device, per_node)
    fits = [describe(p.shape) for p in plans if need_of(p) <= available]
    lines = [f"here, {format_bytes(available)} per rank ({limit}); fit: {', '.join(fits) or 'none'}"]
    lines += [f"the run would stop: {error}"] if error else []
    return "\n".join(textwrap.fill(line, 80, break_on_hyphens=False, subsequent_indent="  ") for line in lines)


def _calls(calls):
    """Consecutive calls of the same kind and size, counted: '  4 x all-reduce of 302.9 MB over 4 ranks'."""
    lines, run = [], []
    for call in calls + [None]:
        if run and (call is None or call[:3] != run[0][:3]):
            op, nbytes, ranks = run[0][:3]
            lines.append(f"  {len(run):>3} x {OP_NAMES[op]} of {format_bytes(nbytes)} over {counted(ranks, 'rank')}")
            run = []
        if call is not None:
            run.append(call)
    return lines

