"""ZeRO++'s quantized communication (arXiv 2306.10209): fewer bytes on the wire, the same shards.

Stage 3 moves 3 Psi (N-1)/N per rank per step: two parameter all-gathers (forward, backward) and
one gradient reduce-scatter. ZeRO++ cuts what crosses the nodes with three ideas; hpZ (a second,
node-local copy of the parameters for backward) is zerompi/hierarchy/hpz.py, the other two
quantize what is sent:

    qwZ   the parameter all-gather sends int8 blocks and their float32 scales; each receiver
          dequantizes them into the layer it computes with. The parameter shards, the fp32
          master and Adam stay exact: only the wire is quantized.   ~ Psi (1 + 4/B) bytes
    qgZ   the gradient reduce-scatter becomes an all-to-all of int4 (or int8) blocks, each
          owner summing the dequantized contributions in float32: each contribution is
          quantized once, never a partial sum (a ring re-quantizing its partial sums at
          every hop accumulates the error; tools/quantization_error.py measures both); across
          nodes in two hops, the node's sum quantized once more for the hop between nodes

    blocks.py       the quantizer: the formula, and the block layout inside each rank's shard
    gather.py       qwZ: stage 3's layer gather in int8 blocks
    reduce.py       qgZ: the gradient reduce-scatter as an all-to-all of int8 or int4 blocks
    collectives.py  QuantizedCollectives: the Collectives whose gather and reduce-scatter are those
    error.py        --quant-error: each step's error against the exact calls, run beside them

`quantized_collectives(weights, grads)` is what zerompi/engine.py's build_engine takes as its
`start_collectives`; the stage files do not change.
"""
from functools import partial

from .blocks import FLT_MIN, Quantizer
from .collectives import QuantizedCollectives
from .error import QUANT_ERROR
from .gather import SCALES, scales_ring_bytes
from .reduce import alltoall_elements, hop_slots, owner_words, two_hop_node_size

__all__ = ["Quantizer", "FLT_MIN", "SCALES", "QUANT_ERROR", "QuantizedCollectives", "quantized_collectives", "scales_ring_bytes",
           "alltoall_elements", "hop_slots", "owner_words", "two_hop_node_size"]


def quantized_collectives(weights=None, grads=None, node_size=None, error=False):
    """start_collectives for build_engine: comm -> Collectives whose parameter gathers are qwZ's
    (weights: a Quantizer) and whose gradient reduce-scatters are qgZ's (grads), in two hops across
    nodes of node_size ranks in blocks (None: one); error: each step's error measured (error.py)."""
    return partial(QuantizedCollectives, weights=weights, grads=grads, node_size=node_size, error=error)
