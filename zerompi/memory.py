"""The ZeRO memory and communication model: what each rank holds and sends.

Notation
--------
    Ψ  number of model parameters
    N  number of data-parallel ranks
    P  bytes of parameter per parameter
    G  bytes of gradient per parameter
    K  bytes of optimizer state per parameter

Mixed-precision Adam: P=2, G=2 (fp16/bf16), K=12 (fp32 master copy, m, v).
fp32 Adam: P=4, G=4, K=8 (m, v; the fp32 parameters are their own master copy).

Model-state memory per rank, and communication per rank per step
(in elements, ring collectives, where one ring all-reduce = reduce-scatter
+ all-gather and each moves Ψ(N-1)/N elements per rank):

    stage  partitioned        memory per rank        communication per step
    -----  -----------------  ---------------------  ----------------------------
      0    nothing            (P + G + K)Ψ           all-reduce grads:  2Ψ(N-1)/N
      1    optimizer state    (P + G)Ψ + KΨ/N        reduce-scatter grads
                                                     + all-gather params: 2Ψ(N-1)/N
      2    + gradients        PΨ + (G + K)Ψ/N        same as stage 1:   2Ψ(N-1)/N
      3    + parameters       (P + G + K)Ψ/N         all-gather params in forward,
                                                     again in backward,
                                                     reduce-scatter grads: 3Ψ(N-1)/N

Example (mixed precision, Ψ = 7.5e9, N = 64; ZeRO paper, Figure 1):
120 GB, 31.4 GB, 16.6 GB and 1.9 GB per rank for stages 0 to 3.

A note on stage 1: one source article describes it as an all-reduce of the
gradients followed by an all-gather of the parameters (3Ψ). The ZeRO paper's
partition-aware version, and ours, use reduce-scatter + all-gather (2Ψ):
reduce-scatter already gives each rank exactly the averaged gradient shard
it updates, so the rest of a full all-reduce would be wasted work.

Across nodes, a flat ring over the ranks in rank order sends each rank's whole volume to rank
r+1 mod N: inter-node when that rank is on another node (flat_ring_node_split). With the ranks in
blocks on k > 1 nodes, k ranks send across, one rank's volume out of each node per collective.

Activations, temporary buffers and fragmentation are not modelled.

Run `python -m zerompi.memory --params 7e9` for the per-rank table.
"""

import argparse
import math
from dataclasses import dataclass

STAGES = (0, 1, 2, 3)
STAGE_NAMES = ("Baseline", "Stage 1", "Stage 2", "Stage 3")
DEFAULT_RANKS = (1, 4, 8, 16, 32, 64, 128)
GB = 1e9


@dataclass(frozen=True)
class BytesPerParam:
    param: float  # P
    grad: float  # G
    optimizer: float  # K


MIXED_PRECISION = BytesPerParam(2, 2, 12)
FP32 = BytesPerParam(4, 4, 8)


def _check(stage, num_params, num_ranks):
    if stage not in STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if not num_ranks >= 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks!r}")
    if not num_params > 0:
        raise ValueError(f"num_params must be > 0, got {num_params!r}")


def model_state_bytes(stage: int, num_params: float, num_ranks: int, b: BytesPerParam) -> dict:
    """{'params': ..., 'grads': ..., 'optimizer': ..., 'total': ...} bytes per rank by the formulas."""
    _check(stage, num_params, num_ranks)
    # Each stage partitions one more model state across the N ranks.
    optimizer_ranks = num_ranks if stage >= 1 else 1
    grad_ranks = num_ranks if stage >= 2 else 1
    param_ranks = num_ranks if stage >= 3 else 1

    params = b.param * num_params / param_ranks
    grads = b.grad * num_params / grad_ranks
    optimizer = b.optimizer * num_params / optimizer_ranks
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "total": params + grads + optimizer}


def comm_elements_per_step(stage: int, num_params: float, num_ranks: int, micro_batches: int = 1) -> float:
    """Per-rank ring volume in elements per step: 2Ψ(N-1)/N for stages 0-2, 3Ψ(N-1)/N for stage 3.

    With K micro-batches per step (gradient accumulation), the stages that keep no full gradient
    between micro-batches communicate per micro-batch: stage 2 reduce-scatters K times,
    (K+1)Ψ(N-1)/N; stage 3 also gathers parameters K times in forward and backward, 3KΨ(N-1)/N.
    """
    _check(stage, num_params, num_ranks)
    # Stages 0-1: all-reduce = reduce-scatter + all-gather (2 passes over Ψ), once per step.
    # Stage 2: a reduce-scatter per micro-batch, one all-gather per step.
    # Stage 3: params all-gathered in forward and in backward, grads reduce-scattered: per micro-batch.
    passes_over_params = {0: 2, 1: 2, 2: micro_batches + 1, 3: 3 * micro_batches}[stage]
    return passes_over_params * num_params * (num_ranks - 1) / num_ranks


def flat_ring_node_split(ring_volume: float, node_of_rank) -> list:
    """[(intra-node, inter-node)] volume of each rank, for a flat ring over the ranks in rank order
    where each rank's ring volume is ring_volume (any unit: elements, bytes) and rank r runs on
    node node_of_rank[r].

    Rank r sends its whole ring volume to rank r+1 mod N: inter-node when that rank is on another
    node, intra-node otherwise. Ranks in blocks on k > 1 nodes: the last rank of each node sends
    across, so the ring crosses node boundaries k times and k x ring_volume is inter-node in all,
    ring_volume out of each node. (One node: all intra-node. Ranks dealt round-robin over k > 1
    nodes: every rank sends across, N x ring_volume.)
    """
    n = len(node_of_rank)
    return [(0.0, ring_volume) if node_of_rank[r] != node_of_rank[(r + 1) % n] else (ring_volume, 0.0)
            for r in range(n)]


# ---------------------------------------------------------------- CLI


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


def _positive_float(text):
    value = _parse_float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative_float(text):
    value = _parse_float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _rank_count(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m zerompi.memory",
        description="Per-rank model-state memory and communication volume per step "
                    "for ZeRO stages 0-3. Stage 0 is plain data parallelism; stages 1, 2 "
                    "and 3 partition the optimizer state, + gradients, + parameters.",
    )
    parser.add_argument("--params", type=_positive_float, required=True,
                        help="number of model parameters Ψ, e.g. 7e9")
    parser.add_argument("--ranks", type=_rank_count, nargs="+", default=list(DEFAULT_RANKS),
                        metavar="N", help="data-parallel rank counts, one table row each "
                                          "(default: " + " ".join(map(str, DEFAULT_RANKS)) + ")")
    bytes_choice = parser.add_mutually_exclusive_group()
    bytes_choice.add_argument("--precision", choices=("mixed", "fp32"), default="mixed",
                              help="mixed: P=2 G=2 K=12 (fp16 params/grads, fp32 master+m+v); "
                                   "fp32: P=4 G=4 K=8 (default: %(default)s)")
    bytes_choice.add_argument("--bytes", type=_non_negative_float, nargs=3, metavar=("P", "G", "K"),
                              help="bytes per parameter of parameter, gradient and optimizer "
                                   "state, overriding --precision")
    return parser


def main(argv=None) -> int:
    args = _build_parser().parse_args(argv)
    if args.bytes is not None:
        b = BytesPerParam(*args.bytes)
        bytes_name = "from --bytes"
    elif args.precision == "fp32":
        b, bytes_name = FP32, "fp32 Adam"
    else:
        b, bytes_name = MIXED_PRECISION, "mixed-precision Adam"
    # Communicated tensors (grads, params) are sent in the parameter dtype.
    bytes_per_element = b.param
    psi = args.params
    header = f"{'GPUs':>6}{STAGE_NAMES[0]:>12}" + "".join(f"{n:>11}" for n in STAGE_NAMES[1:])

    print(f"Bytes per parameter: P={b.param:g} G={b.grad:g} K={b.optimizer:g} ({bytes_name})")
    print()
    print(f"Per-GPU memory (GB) for a {_model_size_name(psi)} parameter model")
    print(header)
    print("-" * 52)
    for n in args.ranks:
        total_gb = [model_state_bytes(s, psi, n, b)["total"] / GB for s in STAGES]
        print(f"{n:>6}{total_gb[0]:>11.1f}G" + "".join(f"{x:>10.1f}G" for x in total_gb[1:]))

    print()
    print(f"Per-GPU communication per step, ring (elements / GB "
          f"at {bytes_per_element:g} bytes per element, the paper's model; zerompi itself reduces "
          f"16-bit gradients in float32, 4 bytes)")
    print(f"{'GPUs':>6}" + "".join(f"{n:>18}" for n in STAGE_NAMES))
    print("-" * 78)
    for n in args.ranks:
        cells = []
        for s in STAGES:
            elements = comm_elements_per_step(s, psi, n)
            cells.append(f"{elements / 1e9:.2f}e9 / {elements * bytes_per_element / GB:.1f}G")
        print(f"{n:>6}" + "".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
