"""qgZ: the gradient reduce-scatter as an all-to-all of quantized blocks (ZeRO++, arXiv 2306.10209).

A reduce-scatter in a ring sums partial sums hop by hop; quantizing what each hop sends would
quantize the partial sums again and again, and their errors would add up with N
(tools/quantization_error.py measures it). qgZ quantizes each rank's contribution once instead,
and lets each owner sum the contributions it receives in full precision:

    rank r       full_r (padded,) = N blocks of n, one per owner; block j --quantize--> levels, scales
    all-to-all   rank j receives block j of every rank: levels (N w, int8)     purpose GRADS
                                                         scales (N k, float32)  purpose SCALES
    owner j      shard_j = (shard_j +, after the first micro-batch) sum_r levels_r * scales_r,
                 summed in the compute dtype (float32; float64 in a float64 run), in rank order

    (w = n bytes of int8 levels; int4 packs two to a byte, w = ceil(n / 2) uint8: blocks.py)

Each rank sends (N-1)/N of its layer as one byte per element with int8, half a byte with int4 (a
reduce-scatter of float32 sends 4), plus 4 bytes per block. The blocks are laid as the quantizer lays them (blocks.py): inside
each owner's shard of the layer.
"""
from ..ledger import GRADS
from .gather import SCALES


def alltoall_elements(per_owner, micro_batches, node_of_rank):
    """[[intra-node, inter-node] words each rank sends per step] in qgZ's all-to-alls: M times a
    block of `per_owner` words to each other rank (Psi / N with int8; the packed bytes with int4,
    sum_u ceil(n_u / 2) exactly, Psi / 2N about) (the formula beside the ledger, whose all-to-all
    records split the same way: zerompi/nodes.py's share_to_other_nodes)."""
    N, block = len(node_of_rank), micro_batches * per_owner
    return [[block * (node_of_rank.count(node) - 1), block * (N - node_of_rank.count(node))]
            for node in node_of_rank]


def owner_words(quantizer, layout):
    """The words of levels one rank sends each owner per micro-batch, sum_u wire_numel(n_u)
    (Psi_pad / N with int8)."""
    return sum(quantizer.wire_numel(layer.shard_size) for layer in layout.layers)


def quantized_reduce_scatter(collectives, full, shard, accumulate):
    """shard (n,) <- (+=, accumulate) sum over ranks r of dequantize(quantize(rank r's block of
    full (N n,) for this rank))."""
    c, quantizer = collectives, collectives.grads
    N, n, k, w = c.size, shard.size, quantizer.blocks(shard.size), quantizer.wire_numel(shard.size)
    for r in range(N):                               # this rank's contribution to owner r
        quantizer.quantize(full[r * n:(r + 1) * n], c.grads_out[r * w:(r + 1) * w],
                           c.scales_out[r * k:(r + 1) * k], c.scratch)
    levels, scales = c.grads_in[:N * w], c.scales_in[:N * k]
    c.comm.alltoall(c.grads_out[:N * w], levels, GRADS)
    c.comm.alltoall(c.scales_out[:N * k], scales, SCALES)
    total, part = c.total[:n], c.part[:n]
    total[...] = shard if accumulate else 0
    for r in range(N):                               # rank r's contribution to this rank's shard
        quantizer.dequantize(levels[r * w:(r + 1) * w], scales[r * k:(r + 1) * k], part, c.scratch)
        total += part
    shard[...] = total
