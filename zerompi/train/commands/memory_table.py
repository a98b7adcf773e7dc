"""`python -m zerompi.memory`: the model of zerompi.memory printed as tables.

    --params Ψ [--ranks N ...]            per-GPU model-state memory of stages 0-3, one row per N (the
                                          source article's table), then the per-GPU ring volume per step
    --params Ψ --ranks-per-node L         across nodes, one row per node count k (N = kL): per-GPU memory
               [--nodes k ...] [--shard-group S]
                                          and the busiest node's inter-node bytes per step, for flat
                                          ZeRO stages 0-3, hybrid sharding in groups of S (default L)
                                          and stage 3 with hpZ

Bytes per parameter from --precision (mixed, fp32) or --bytes P G K. Bad flags: one line,
`zerompi: error: ...`, and exit status 2.
"""

import argparse
import math
import sys

from ...memory import (FP32, MIXED_PRECISION, MOST_PARAMS, MOST_RANKS, STAGE_COLLECTIVES, STAGES, BytesPerParam,
                       comm_elements_per_step, flat_collectives, hpz_collectives, hpz_model_state_bytes,
                       hybrid_collectives, hybrid_model_state_bytes, inter_node_per_node, model_state_bytes,
                       partitioned, passes_over_params, ring_traffic_per_rank, wire_bytes)
from ...util.exit_codes import ExitCode
from ...util.inputs import printable
from ...util.pipes import until_reader_leaves

STAGE_NAMES = ("Baseline", "Stage 1", "Stage 2", "Stage 3")
DEFAULT_RANKS = (1, 4, 8, 16, 32, 64, 128)
MOST_BYTES_PER_PARAM = 1024          # float64 Adam keeps 32: a kilobyte a parameter is no precision there is
DEFAULT_NODES = (1, 2, 4, 8, 16)

def _model_size_name(num_params):
    """7e9 -> '7B', 1.3e8 -> '130M'."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if num_params >= scale:
            return f"{num_params / scale:g}{suffix}"
    return f"{num_params:g}"


def _parse_float(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_float(text):
    """A positive number whose reciprocal is finite too (no denormal: 1e-320 GFLOP/s is an
    infinite step time)."""
    value = _parse_float(text)
    if not (value >= sys.float_info.min and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number (at least {sys.float_info.min:.3g}), "
                                         f"got {text!r}")
    return value


def parameter_count(text):
    value = positive_float(text)
    if value > MOST_PARAMS:
        raise argparse.ArgumentTypeError(f"{text} parameters: more than any machine can address (2^63 bytes "
                                         f"hold {MOST_PARAMS:.2g} of them at 16 bytes each)")
    return value


def non_negative_float(text):
    value = _parse_float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def bytes_per_parameter(text):
    value = non_negative_float(text)
    if value > MOST_BYTES_PER_PARAM:
        raise argparse.ArgumentTypeError(f"must be at most {MOST_BYTES_PER_PARAM} bytes a parameter, got {text!r}")
    return value


def rank_count(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= MOST_RANKS:
        raise argparse.ArgumentTypeError(f"must be an integer in 1..{MOST_RANKS}, got {text!r}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, `zerompi: error: ...`, and exit status 2."""

    def error(self, message):
        print(f"zerompi: error: {printable(message)}", file=sys.stderr)
        raise SystemExit(ExitCode.BAD_INPUT)


def _build_parser():
    parser = OneLineParser(
        prog="python -m zerompi.memory",
        description="Per-rank model-state memory and communication volume per step "
                    "for ZeRO stages 0-3. Stage 0 is plain data parallelism; stages 1, 2 "
                    "and 3 partition the optimizer state, + gradients, + parameters. "
                    "With --ranks-per-node: the same across nodes, beside hybrid sharding "
                    "and stage 3 with hpZ, and the bytes each node sends to the others.",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--params", type=parameter_count, help="number of model parameters Ψ, e.g. 7e9")
    what.add_argument("--formulas", action="store_true",
                      help="the four stages' formulas in Ψ and N, and their collectives")
    parser.add_argument("--ranks", type=rank_count, nargs="+",
                        metavar="N", help="data-parallel rank counts, one table row each "
                                          "(default: " + " ".join(map(str, DEFAULT_RANKS)) + ")")
    bytes_choice = parser.add_mutually_exclusive_group()
    bytes_choice.add_argument("--precision", choices=("mixed", "fp32"), default="mixed",
                              help="mixed: P=2 G=2 K=12 (fp16 params/grads, fp32 master+m+v); "
                                   "fp32: P=4 G=4 K=8 (default: %(default)s)")
    bytes_choice.add_argument("--bytes", type=bytes_per_parameter, nargs=3, metavar=("P", "G", "K"),
                              help="bytes per parameter of parameter, gradient and optimizer "
                                   "state, overriding --precision")
    nodes = parser.add_argument_group(
        "across nodes", "Print per-rank memory and the inter-node bytes per node per step of stages "
                        "0-3 over all ranks (flat), hybrid sharding (stages 1-3 inside groups of S "
                        "consecutive ranks, replicas across the groups) and stage 3 with hpZ (a "
                        "secondary copy of the parameters sharded over each node), ranks placed in "
                        "blocks of L per node, one row per node count. Ring model: a rank's bytes "
                        "cross nodes when its successor in the ring is on another node.")
    nodes.add_argument("--ranks-per-node", type=rank_count, metavar="L",
                       help="ranks per node: print the tables across nodes instead of the --ranks ones")
    nodes.add_argument("--nodes", type=rank_count, nargs="+", metavar="k",
                       help="node counts, one row each (N = k L ranks; default: "
                            + " ".join(map(str, DEFAULT_NODES)) + ", those whose N the group divides)")
    nodes.add_argument("--shard-group", type=rank_count, metavar="S",
                       help="ranks per group of hybrid sharding, dividing every row's N "
                            "(default: L, one node)")
    return parser


def _check_args(parser, args):
    """Errors of flags that only make sense together, and group sizes that do not divide N."""
    if args.ranks_per_node is None:
        for flag, value in (("--nodes", args.nodes), ("--shard-group", args.shard_group)):
            if value is not None:
                parser.error(f"{flag} needs --ranks-per-node")
        return
    if args.ranks is not None:
        parser.error("--ranks and --ranks-per-node exclude each other: "
                     "with --ranks-per-node the rows are --nodes")
    group = args.shard_group or args.ranks_per_node
    if args.nodes is None:                      # the default rows: those the group divides
        args.nodes = [k for k in DEFAULT_NODES if k * args.ranks_per_node % group == 0] or None
        if args.nodes is None:
            parser.error(f"--shard-group {group} divides none of the default rows' N: give --nodes")
    for k in args.nodes:
        if k * args.ranks_per_node > MOST_RANKS:
            parser.error(f"--nodes {k} x --ranks-per-node {args.ranks_per_node} is more than {MOST_RANKS} ranks")
        if (k * args.ranks_per_node) % group:
            parser.error(f"--shard-group {group} does not divide N = {k * args.ranks_per_node} "
                         f"(--nodes {k} x --ranks-per-node {args.ranks_per_node})")


def _print_flat_tables(psi, ranks, b):
    """The per-GPU memory of stages 0-3 (the source article's table) and the per-GPU ring volume."""
    # Communicated tensors (grads, params) are sent in the parameter dtype.
    bytes_per_element = b.param
    header = f"{'GPUs':>6}{STAGE_NAMES[0]:>12}" + "".join(f"{n:>11}" for n in STAGE_NAMES[1:])
    unit, letter = _unit(model_state_bytes(0, psi, 1, b)["total"])
    print(f"Per-GPU memory ({letter}B) for a {_model_size_name(psi)} parameter model")
    print(header)
    print("-" * 52)
    for n in ranks:
        total = [model_state_bytes(s, psi, n, b)["total"] / unit for s in STAGES]
        print(f"{n:>6}{total[0]:>11.1f}{letter}" + "".join(f"{x:>10.1f}{letter}" for x in total[1:]))

    print()
    largest = max(comm_elements_per_step(s, psi, n) for s in STAGES for n in ranks)
    count_unit, _ = _unit(largest)
    exponent = f"e{len(str(int(count_unit))) - 1}" if count_unit > 1 else ""
    unit, letter = _unit(largest * bytes_per_element)
    print(f"Per-GPU communication per step, ring (elements / {letter}B "
          f"at {bytes_per_element:g} bytes per element, the paper's model; zerompi itself reduces "
          f"16-bit gradients in float32, 4 bytes)")
    print(f"{'GPUs':>6}" + "".join(f"{n:>18}" for n in STAGE_NAMES))
    print("-" * 78)
    for n in ranks:
        cells = []
        for s in STAGES:
            elements = comm_elements_per_step(s, psi, n)
            cells.append(f"{elements / count_unit:.2f}{exponent} / {elements * bytes_per_element / unit:.1f}{letter}")
        print(f"{n:>6}" + "".join(f"{c:>18}" for c in cells))


def _variants(psi, n, ranks_per_node, group, b):
    """(model state bytes per rank, collectives per step) of each column across nodes, in order:
    flat stages 0-3, hybrid stages 1-3, stage 3 with hpZ."""
    return ([(model_state_bytes(s, psi, n, b), flat_collectives(s, psi, n)) for s in STAGES] +
            [(hybrid_model_state_bytes(s, psi, n, group, b), hybrid_collectives(s, psi, n, group))
             for s in STAGES[1:]] +
            [(hpz_model_state_bytes(psi, n, ranks_per_node, b), hpz_collectives(psi, n, ranks_per_node))])


def _print_node_tables(psi, ranks_per_node, node_counts, group, b):
    """Per-GPU memory and the busiest node's inter-node bytes per step, one column per variant."""
    titles = (f"{'flat: ZeRO over all N GPUs':^32}{f'hybrid: groups of {group}':^24}{'hpZ':>8}\n"
              f"{'nodes':>5}{'GPUs':>6}" + "".join(f"{f'Stage {s}':>8}" for s in STAGES + STAGES[1:] + (3,)))
    rows = [(k, k * ranks_per_node, _variants(psi, k * ranks_per_node, ranks_per_node, group, b))
            for k in node_counts]

    unit, letter = _unit(max(state["total"] for _, _, variants in rows for state, _ in variants))
    print(f"Per-GPU memory ({letter}B) for a {_model_size_name(psi)} parameter model, "
          f"{ranks_per_node} GPUs per node")
    print(" " * 11 + titles)
    print("-" * 75)
    for k, n, variants in rows:
        print(f"{k:>5}{n:>6}" + "".join(f"{state['total'] / unit:>7.1f}{letter}" for state, _ in variants))

    traffic = [[max(wire_bytes(node, b) for node in inter_node_per_node(
        ring_traffic_per_rank(collectives, n, ranks_per_node), ranks_per_node)) for _, collectives in variants]
        for _, n, variants in rows]
    unit, letter = _unit(max(max(row) for row in traffic))
    print()
    print(f"Inter-node traffic per node per step ({letter}B the busiest node sends to other nodes, ring model)")
    print(f"gradients at G={b.grad:g} and parameters at P={b.param:g} bytes per element "
          f"(zerompi itself reduces 16-bit gradients in float32)")
    print(" " * 11 + titles)
    print("-" * 75)
    for (k, n, _), cells in zip(rows, traffic):
        print(f"{k:>5}{n:>6}" + "".join(f"{x / unit:>7.1f}{letter}" for x in cells))


def _unit(largest):
    """(the unit, its SI letter) a table's numbers are written in, from its largest: GB down to
    bytes, so that a small model's table shows its numbers instead of 0.0G."""
    return next(((size, letter) for size, letter in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if largest >= size), (1, ""))


def formula_table():
    """The four stages' formulas as text, from zerompi.memory's partitioned and passes_over_params
    (what model_state_bytes and comm_elements_per_step compute, which the report checks)."""
    letters = {"params": "P", "grads": "G", "optimizer": "K"}
    mixed = {"params": MIXED_PRECISION.param, "grads": MIXED_PRECISION.grad, "optimizer": MIXED_PRECISION.optimizer}
    lines = ["stage  params  grads  optimizer  memory per rank     mixed precision  communication per rank"]
    for stage in STAGES:
        split = partitioned(stage)                           # kind -> sharded over the N ranks
        whole_kinds = [kind for kind in letters if not split[kind]]
        split_kinds = [kind for kind in letters if split[kind]]
        memory = _terms([letters[k] for k in whole_kinds], [letters[k] for k in split_kinds])
        whole, shared = sum(mixed[k] for k in whole_kinds), sum(mixed[k] for k in split_kinds)
        numbers = " + ".join(t for t in (f"{whole:g}Ψ" if whole else "", f"{shared:g}Ψ/N" if shared else "") if t)
        held = ["1/N" if split[kind] else "full" for kind in letters]
        lines.append(f"  {stage}    {held[0]:<7} {held[1]:<6} {held[2]:<9}  {memory:<19} {numbers:<16} "
                     f"{passes_over_params(stage)}Ψ(N-1)/N")
    lines += ["Ψ parameters, N ranks; P, G, K bytes per parameter of parameter, gradient and optimizer state "
              "(mixed precision: 2, 2, 12)", "collectives, and when:"]
    lines += [f"  {stage}  {text}" for stage, text in zip(STAGES, STAGE_COLLECTIVES)]
    return "\n".join(lines)


def _terms(whole, split):
    """'(P + G)Ψ + KΨ/N' from the letters held whole and split over N."""
    def term(letters, over):
        inside = letters[0] if len(letters) == 1 else f"({' + '.join(letters)})"
        return f"{inside}Ψ{over}" if letters else ""
    return " + ".join(t for t in (term(whole, ""), term(split, "/N")) if t)


def main(argv=None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.formulas:
        print(formula_table())
        return 0
    if args.params is None:
        parser.error("the following arguments are required: --params (or --formulas)")
    _check_args(parser, args)
    if args.bytes is not None:
        b = BytesPerParam(*args.bytes)
        bytes_name = "from --bytes"
    elif args.precision == "fp32":
        b, bytes_name = FP32, "fp32 Adam"
    else:
        b, bytes_name = MIXED_PRECISION, "mixed-precision Adam"

    print(f"Bytes per parameter: P={b.param:g} G={b.grad:g} K={b.optimizer:g} ({bytes_name})")
    print()
    if args.ranks_per_node is None:
        _print_flat_tables(args.params, args.ranks or DEFAULT_RANKS, b)
    else:
        _print_node_tables(args.params, args.ranks_per_node, args.nodes,
                           args.shard_group or args.ranks_per_node, b)
    return 0


def command():
    """The exit status of `python -m zerompi.memory` (zerompi/memory/__main__.py): `| head` ends it quietly."""
    return until_reader_leaves(main) or 0
