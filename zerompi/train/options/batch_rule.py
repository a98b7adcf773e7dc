"""The batch rule: global batch = micro-batch x accumulation x N.

    G  rows per optimizer step over all N ranks   --batch-size        (DeepSpeed: train_batch_size)
    b  rows per rank in each micro-batch          --micro-batch-size  (train_micro_batch_size_per_gpu)
    M  micro-batches per optimizer step           --grad-accum        (gradient_accumulation_steps)

G = b x M x N, and any two of the three decide the third, as DeepSpeed resolves them. Given only G:
M = 1. Given only b or only M: the other of the two is its default (M = 1, b = DEFAULT_MICRO_BATCH).
None given: b = DEFAULT_MICRO_BATCH, M = 1, so that any N runs (`mpirun -n 8`: G = 128).

One rule for the flags, TOML and DeepSpeed files alike (config.py's parse_args calls resolve_batch
for N ranks). Sizes that do not fit are an ArgumentError whose one line suggests the nearest values
that do: the global batches around G that split (multiples of N x M, or of N x b), and the
accumulation or micro-batch nearest the given one that divides G/N.
"""
import math

from ...util.words import counted
from .errors import ArgumentError

DEFAULT_MICRO_BATCH = 16      # rows per rank per micro-batch when no batch option is given


def resolve_batch(global_batch, micro_batch, accumulation, num_ranks):
    """(global batch G, micro-batch b, accumulation M), G = b x M x N, from the batch options given
    (None: not given): any two decide the third; only G: M = 1; only b or only M: the other of
    the two is its default (M 1, b DEFAULT_MICRO_BATCH); none: b = DEFAULT_MICRO_BATCH, M = 1.
    Raises ArgumentError, one line naming the nearest valid values."""
    N = num_ranks
    for flag, value in (("--batch-size", global_batch), ("--micro-batch-size", micro_batch),
                        ("--grad-accum", accumulation)):
        if value is not None and value <= 0:
            raise ArgumentError(f"{flag} must be positive, got {value}")
    if global_batch is None:
        b = DEFAULT_MICRO_BATCH if micro_batch is None else micro_batch
        M = 1 if accumulation is None else accumulation
        return b * M * N, b, M
    if micro_batch is None:
        M = 1 if accumulation is None else accumulation
        if global_batch % (N * M):
            raise ArgumentError(_unsplittable(global_batch, N, M, accumulation is not None))
        return global_batch, global_batch // (N * M), M
    if accumulation is None:
        if global_batch % (N * micro_batch):
            raise ArgumentError(_no_whole_accumulation(global_batch, N, micro_batch))
        return global_batch, micro_batch, global_batch // (N * micro_batch)
    if global_batch != micro_batch * accumulation * N:
        raise ArgumentError(f"--batch-size {global_batch}, --micro-batch-size {micro_batch} and --grad-accum "
                            f"{accumulation} disagree on {counted(N, 'rank')}: {micro_batch} x {accumulation} x "
                            f"{N} = {micro_batch * accumulation * N}; use --batch-size "
                            f"{micro_batch * accumulation * N}, or give only two of the three")
    return global_batch, micro_batch, accumulation


def _unsplittable(G, N, M, accumulation_given):
    """G rows do not split into M micro-batches on N ranks: the nearest global batches that do,
    and the nearest accumulation that splits G (if given) or the per-rank micro-batch (if not)."""
    options = [_either("--batch-size", _multiples_around(G, N * M))]
    if accumulation_given:
        near = _divisors_around(G // N, M) if G % N == 0 else []
        if near:
            options.append(_either("--grad-accum", near))
    elif G // N:
        options.append(f"--micro-batch-size {G // N} instead (a global batch of {G // N * N})")
    return (f"--batch-size {G} cannot be split over {counted(N, 'rank')} x {counted(M, 'micro-batch')}: "
            f"use {', or '.join(options)}")


def _no_whole_accumulation(G, N, b):
    """G rows are no whole number of micro-batches of b rows on N ranks: the nearest global
    batches that are, and the nearest micro-batches that split G."""
    options = [_either("--batch-size", _multiples_around(G, N * b))]
    near = _divisors_around(G // N, b) if G % N == 0 else []
    if near:
        options.append(_either("--micro-batch-size", near))
    return (f"--batch-size {G} is no whole number of micro-batches of {b} rows on {counted(N, 'rank')}: "
            f"use {', or '.join(options)}")


def _either(flag, values):
    return f"{flag} {' or '.join(map(str, values))}"


def _multiples_around(value, step):
    """The multiples of step just below and just above value (below only where positive)."""
    below = value // step * step
    return [v for v in (below, below + step) if v > 0]


MAX_DIVISOR_SEARCH = 10 ** 6       # trial divisions at most: a huge batch (a typo) gets no divisor advice


def _divisors_around(value, near):
    """The divisors of value nearest to `near`, the one below and the one above (where they exist);
    none for a value with more than MAX_DIVISOR_SEARCH^2 rows (the divisors pair up below its root)."""
    root = math.isqrt(value)
    if root > MAX_DIVISOR_SEARCH:
        return []
    small = [d for d in range(1, root + 1) if value % d == 0]
    divisors = sorted(set(small + [value // d for d in small]))
    below = [d for d in divisors if d < near]
    above = [d for d in divisors if d > near]
    return below[-1:] + above[:1]
