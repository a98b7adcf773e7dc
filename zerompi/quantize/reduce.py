"""qgZ: the gradient reduce-scatter as an all-to-all of quantized blocks (ZeRO++, arXiv 2306.10209).

A reduce-scatter in a ring sums partial sums hop by hop; quantizing what each hop sends would
quantize the partial sums again and again, and their errors would add up with N
(tools/quantization_error.py measures it). qgZ quantizes each rank's contribution once instead,
and lets each owner sum the contributions it receives in full precision:

    rank r       full_r (padded,) = N blocks of n, one per owner; block j --quantize--> levels, scales
    all-to-all   rank j receives block j of every rank: levels (N w, int8)     purpose GRADS
                                                         scales (N k, float32)  purpose SCALES
    owner j      shard_j = sum_r levels_r * scales_r (+ shard_j, after the first micro-batch),
                 summed in the compute dtype (float32; float64 in a float64 run), in rank order

    (w = n bytes of int8 levels; int4 packs two to a byte, w = ceil(n / 2) uint8: blocks.py)

Each rank sends (N-1)/N of its layer as one byte per element with int8, half a byte with int4 (a
reduce-scatter of float32 sends 4), plus 4 bytes per block. The blocks are laid as the quantizer
lays them (blocks.py): inside each owner's shard of the layer.

Across M nodes of L ranks (block placement, 1 < L < N), two hops, so that what crosses the nodes
is one quantized sum per node instead of every rank's contribution:

    hop 1, inside the node (L ranks)    rank (a, p) sends its local peer q the blocks of the M
                                        owners b L + q (b = 0..M-1), each quantized once; q sums
                                        the L dequantized contributions in the compute dtype:
                                        node_sum (M n,) = node a's sum for those M owners
    hop 2, between nodes (M ranks of    node a's rank q sends node b's rank q (owner b L + q) its
    one local index q)                  block of node_sum, quantized once; the owner sums the M
                                        nodes' dequantized sums, in node order

    a rank's words per micro-batch: (L-1) M w inside its node, (M-1) w to other nodes (one hop:
    (L-1) w and (N-L) w; N - 1 slots of w either way): L times fewer cross the nodes, for two
    quantizations of each value
"""
from ..ledger import GRADS
from .gather import SCALES


def two_hop_node_size(node_of_rank):
    """L when every node holds L consecutive ranks (block placement: rank r on node r // L) and
    1 < L < N: the nodes qgZ's two hops run over; else None (one all-to-all)."""
    N, size = len(node_of_rank), node_of_rank.count(node_of_rank[0])
    blocks = N % size == 0 and all(node == rank // size for rank, node in enumerate(node_of_rank))
    return size if blocks and 1 < size < N else None


def owner_words(quantizer, layout):
    """The words of levels one rank sends each owner per micro-batch, sum_u wire_numel(n_u)
    (Psi_pad / N with int8)."""
    return sum(quantizer.wire_numel(layer.shard_size) for layer in layout.layers)


def hop_slots(node_of_rank, node_size=None):
    """[[intra-node, inter-node] slots (one owner's shard of every layer) each rank sends per
    micro-batch]: one to each other rank, or with two hops (node_size L, M = N / L nodes) M (L-1)
    inside the node and M - 1 between nodes, N - 1 either way (zerompi/nodes.py's
    share_to_other_nodes splits the ledger's all-to-all records the same way)."""
    N = len(node_of_rank)
    if node_size:
        nodes = N // node_size
        return [[nodes * (node_size - 1), nodes - 1]] * N
    return [[node_of_rank.count(node) - 1, N - node_of_rank.count(node)] for node in node_of_rank]


def alltoall_elements(per_owner, micro_batches, node_of_rank, node_size=None):
    """[[intra-node, inter-node] words each rank sends per step] in qgZ's all-to-alls: M hop_slots
    of `per_owner` words (Psi / N with int8; the packed bytes with int4, sum_u ceil(n_u / 2)
    exactly, about Psi / 2N): the formula beside the ledger."""
    return [[micro_batches * per_owner * slots for slots in pair] for pair in hop_slots(node_of_rank, node_size)]


def quantized_reduce_scatter(collectives, full, shard, accumulate):
    """shard (n,) <- (+=, accumulate) sum over ranks r of dequantize(quantize(rank r's block of
    full (N n,) for this rank)); with two hops (collectives.node_comm), the sum over nodes of
    dequantize(quantize(the node's sum of its ranks' dequantized blocks))."""
    c, n = collectives, shard.size
    total = c.total[:n]
    if c.node_comm is None:
        exchange(c, c.comm, [full[r * n:(r + 1) * n] for r in range(c.size)])
    else:
        L, M = c.node_comm.size, c.cross_comm.size
        exchange(c, c.node_comm, [full[(b * L + q) * n:(b * L + q + 1) * n] for q in range(L) for b in range(M)])
        node_sum = c.node_sum[:M * n]
        node_sum[...] = 0
        for q in range(L):                           # local peer q's contributions, in rank order
            for b in range(M):
                add_received(c, q * M + b, node_sum[b * n:(b + 1) * n])
        exchange(c, c.cross_comm, [node_sum[b * n:(b + 1) * n] for b in range(M)])
    total[...] = 0
    for r in range(c.comm.size if c.node_comm is None else c.cross_comm.size):
        add_received(c, r, total)                    # rank r's (node r's) contribution to this shard
    if c.error is not None:                          # --quant-error: the exact sum beside it (error.py)
        c.error.grads(full, total)
    if accumulate:                                   # the micro-batches so far, added in the compute dtype
        part = c.part[:n]
        part[...] = shard
        total += part
    shard[...] = total


def exchange(c, comm, blocks):
    """Quantize the blocks (each (n,)), the i-th into the i-th slot of the send buffers, and
    all-to-all their levels and scales over comm (len(blocks) / comm.size slots to each rank)."""
    quantizer, n = c.grads, blocks[0].size
    k, w, count = quantizer.blocks(n), quantizer.wire_numel(n), len(blocks)
    for i, block in enumerate(blocks):
        quantizer.quantize(block, c.grads_out[i * w:(i + 1) * w], c.scales_out[i * k:(i + 1) * k], c.scratch)
    comm.alltoall(c.grads_out[:count * w], c.grads_in[:count * w], GRADS)
    comm.alltoall(c.scales_out[:count * k], c.scales_in[:count * k], SCALES)


def add_received(c, i, out):
    """out (n,) += the i-th received slot, dequantized (in the compute dtype)."""
    quantizer, n = c.grads, out.size
    k, w = quantizer.blocks(n), quantizer.wire_numel(n)
    part = c.part[:n]
    quantizer.dequantize(c.grads_in[i * w:(i + 1) * w], c.scales_in[i * k:(i + 1) * k], part, c.scratch)
    out += part
