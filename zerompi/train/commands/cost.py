"""The cost model: one training step's time, per stage, from a run's plan and a machine's limits.

Pure arithmetic on a RunPlan (zerompi/plan/__init__.py: the collectives the run will make, each
as MPI gets it) and a Machine (measured by zerompi/train/commands/calibrate.py, or a cluster's numbers):

    step = compute + elementwise + optimizer + overhead + comm - hidden + offload

    compute      the GEMMs of one step per rank, each at the GEMM rate for its size:
                 per layer of input width I, output width O, micro-batch rows B, per micro-batch
                     forward  x W^T     2 B I O
                     backward dy^T x    2 B I O,   dy W  2 B I O (not for the first layer: its
                                                   input gradient is not needed, zerompi/model.py)
                 rate(f) for a GEMM of f FLOPs: the calibrated rates at a ladder of sizes,
                 interpolated in log f (clamped at the ends); one number for a cluster
    elementwise  bias, GELU forward and backward, the loss: per output element of a layer and
                 micro-batch, the calibrated seconds (or ELEMENTWISE_BYTES / bandwidth); in
                 mixed precision on a CPU also the weight widened twice and the weight gradient
                 rounded (18 bytes per weight element), and every widened reduction (12 bytes
                 per float32 element reduced: widen, round back), over memory bandwidth; with
                 qwZ each quantized gather's quantize (48 bytes per element of the rank's shard)
                 and dequantize (24 per element of the layer), with qgZ each quantized reduction's
                 (48 + 24 per element of the layer), over memory bandwidth
    optimizer    AdamW over the elements this rank owns (all in stage 0, 1/N in stages 1-3):
                 calibrated seconds per element of zerompi.adam itself for the dtype, or the
                 bytes AdamW must move per element (ADAM_BYTES) / memory bandwidth
    overhead     Python's fixed cost per layer and micro-batch, and per step (calibrated on a
                 tiny model; 0 for a cluster's numbers)
    comm         every PlannedCall of the step, priced one by one:
                   measured    the time of that operation at that many ranks, interpolated
                               linearly in bytes between the two measured sizes around it
                               (captures MPI's algorithm switches); below the smallest measured
                               size its time, above the largest scaled in proportion to bytes
                   alpha-beta  a ring over n ranks, latency a, bandwidth b (bytes/s):
                               reduce-scatter, all-gather  (n-1) a + (n-1)/n bytes / b
                               all-reduce                  twice that
                               a call whose ranks span several nodes runs at the inter-node
                               a and b (a ring is as fast as its slowest link), else intra-node
                 a call on one rank costs nothing in alpha-beta
    hidden       overlap off: 0. Overlap on (a communication thread, zerompi/overlap/):
                     hideable = the gradient reductions but the last one (it has no backward
                                left to run behind) + stage 3's parameter all-gathers but the
                                first (prefetched behind the layers before them)
                     hidden   = overlap_efficiency x min(hideable, compute x (L-1)/L)
                 The step's metric sums (purpose METRICS) and stages 1-2's all-gathers
                 after AdamW are never hidden. overlap_efficiency is 1 where each rank has a
                 spare core or a network card moves its bytes, 0 where every core runs a rank
                 (measured: the copies then take the cores the GEMMs need,
                 docs/overlap-and-performance.md).
    offload      the file tier's I/O that nothing hides (zerompi/offload/), at the folder's rates
                 (calibrated with --offload-dir): the page cache's where the node's offload files
                 fit in the memory the run leaves free, else the disk's (synced writes, reads of
                 pages dropped from the cache). With S the optimizer state in the file, P the
                 parameter shard in the file, M micro-batches, L layers, e = overlap_efficiency:
                     update   io_u = (S + P) / read + (S + P) / write    behind AdamW's seconds
                     passes   io_p = 2 M P / read                        behind compute + elementwise
                     first    what nothing runs beside: the first tile of S read and the last
                              written (T x C elements), and layer 0's shard (P / L) at the step's start
                     exposed  io - e x min(io - first, what it runs behind), for each
                 The host tier on a CPU is the device's memory: it costs what AdamW in memory does.
"""
import bisect
import math
from dataclasses import dataclass, field

from ...ledger import ALLGATHER, ALLREDUCE, ALLTOALL, FILE, GRADS, PARAMS, REDUCE_SCATTER
from ...offload import TILE
from ...quantize import SCALES

OPS = (ALLREDUCE, REDUCE_SCATTER, ALLGATHER)
ELEMENTWISE_BYTES = 8 * 24    # ~24 passes (bias, GELU forward 9, backward 12, bias sum), read + write float32
WIDEN_WEIGHT_BYTES = 18       # mixed precision, CPU: widen W forward (2 + 4) and backward (2 + 4), round dW (4 + 2)
WIDEN_REDUCE_BYTES = 12       # per float32 element of a widened reduction: widen (2 + 4), round back (4 + 2)
QUANTIZE_BYTES = 48           # qwZ, per element of a rank's shard: to float32 (8 + 4), max and min (8), divide,
#                               rint, clip (24), to int8 (4 + 1), rounded up
DEQUANTIZE_BYTES = 24         # per element of the gathered layer: int8 to float32 (1 + 4), multiply (8), out (4 + 8)


def adam_bytes(precision):
    """Bytes AdamW must move per owned element: read g, p, m, v and write p, m, v; in mixed
    precision p is the float32 master and the 16-bit parameter is written too."""
    c, s = precision.compute.itemsize, precision.storage.itemsize
    return s + 6 * c + (s if precision.mixed else 0)


class CostError(ValueError):
    """A machine or a plan the model cannot price: one line."""


@dataclass(frozen=True)
class Link:
    latency_s: float                 # alpha, per ring step
    bandwidth: float                 # beta, bytes per second per rank

    def seconds(self, op, nbytes, ranks):
        if ranks == 1:
            return 0.0
        ring = (ranks - 1) * self.latency_s + (ranks - 1) / ranks * nbytes / self.bandwidth
        return 2 * ring if op == ALLREDUCE else ring


@dataclass(frozen=True)
class FileRates:
    """An offload folder's rates, bytes per second per rank with every rank of the node moving at once."""
    read: float                      # pages not in the cache: from the disk
    write: float                     # written and synced (fsync): to the disk
    cached_read: float               # pages in the page cache
    cached_write: float              # into the page cache, not synced (as a run's writes go)


@dataclass(frozen=True)
class Machine:
    """Per-rank limits, with all ranks of a node busy at once (as in training)."""
    gemm: tuple                      # ((FLOPs of one GEMM, FLOP/s), ...) by size; one pair: one rate
    bandwidth: float                 # memory bandwidth, bytes per second per rank
    intra: Link = None               # alpha-beta inside a node (None: measured tables only)
    inter: Link = None               # between nodes
    collectives: dict = field(default_factory=dict)   # ranks -> op -> ((bytes, seconds), ...)
    elementwise_s: float = None      # seconds per layer output element (None: ELEMENTWISE_BYTES / bandwidth)
    adam_s: dict = field(default_factory=dict)        # dtype name -> seconds per owned element
    layer_overhead_s: float = 0.0    # per layer and micro-batch
    step_overhead_s: float = 0.0     # per step
    overlap_efficiency: float = 1.0  # fraction of the hideable communication that overlap hides
    files: FileRates = None          # the offload folder's rates (None: not calibrated)

    def gemm_rate(self, flops):
        sizes = [f for f, _ in self.gemm]
        if flops <= sizes[0]:
            return self.gemm[0][1]
        if flops >= sizes[-1]:
            return self.gemm[-1][1]
        i = bisect.bisect_right(sizes, flops)
        (f0, r0), (f1, r1) = self.gemm[i - 1], self.gemm[i]
        w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
        return r0 + w * (r1 - r0)

    def call_seconds(self, call):
        """One PlannedCall: its measured time at its ranks if calibrated, else alpha-beta. An all-to-all
        (qgZ's) is priced as the all-gather of its buffer: each sends (N-1)/N of it, in N-1 steps."""
        table = self.collectives.get(call.ranks)
        if table is not None:
            return interpolate(table[ALLGATHER if call.op == ALLTOALL else call.op], call.nbytes)
        if call.ranks == 1:
            return 0.0
        link = self.inter if call.nodes > 1 else self.intra
        if link is None:
            measured = ", ".join(str(n) for n in sorted(self.collectives))
            raise CostError(f"the collectives on {call.ranks} ranks were not measured (measured on: "
                            f"{measured}): calibrate under `mpirun -n {call.ranks}`, or give the link's "
                            f"bandwidth and latency" if self.collectives else
                            f"a collective {'across nodes' if call.nodes > 1 else 'inside a node'} "
                            f"needs that link's bandwidth and latency")
        return link.seconds(call.op, call.nbytes, call.ranks)


def interpolate(points, nbytes):
    """Seconds at nbytes from measured (bytes, seconds) points, sorted by bytes."""
    sizes = [b for b, _ in points]
    if nbytes <= sizes[0]:
        return points[0][1]
    if nbytes >= sizes[-1]:
        return points[-1][1] * nbytes / sizes[-1]
    i = bisect.bisect_right(sizes, nbytes)
    (b0, t0), (b1, t1) = points[i - 1], points[i]
    return t0 + (nbytes - b0) / (b1 - b0) * (t1 - t0)


@dataclass(frozen=True)
class StepCost:
    compute_s: float
    elementwise_s: float
    optimizer_s: float
    overhead_s: float
    comm_s: float
    hidden_s: float
    offload_s: float = 0.0

    @property
    def step_s(self):
        return (self.compute_s + self.elementwise_s + self.optimizer_s + self.overhead_s + self.comm_s
                - self.hidden_s + self.offload_s)


def gemm_flops(sizes, rows):
    """The FLOPs of each GEMM of one micro-batch's forward and backward, per rank."""
    flops = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        one = 2 * rows * n_in * n_out
        flops += [one, one] + ([one] if i > 0 else [])       # x W^T, dy^T x, and dy W but for layer 0
    return flops


def owned_elements(plan):
    """The elements AdamW updates on this rank: its optimizer bytes, in every tier, over K bytes
    per element."""
    optimizer = sum(b[4] for b in plan.buffers if b[0] == "optimizer")
    return optimizer // int(plan.shape.precision.bytes_per_param().optimizer)


def quantizer_passes(calls, grads_quantizer=None):
    """qwZ's and qgZ's bytes of memory traffic (zerompi/quantize/), from each quantized call's levels
    (the call before its scales', one byte per element of the layer; qgZ's int4 two): a gather
    quantizes this rank's shard and dequantizes the whole layer; a reduction quantizes the whole
    layer and dequantizes (and adds) N contributions to the shard (each of its two hops, its part)."""
    per_byte = 8 // grads_quantizer.bits if grads_quantizer else 1          # elements per byte of levels
    layers = [levels for levels, scales in zip(calls, calls[1:]) if scales.purpose == SCALES]
    return sum(c.nbytes * per_byte * (QUANTIZE_BYTES + DEQUANTIZE_BYTES) if c.op == ALLTOALL
               else c.nbytes / c.ranks * QUANTIZE_BYTES + c.nbytes * DEQUANTIZE_BYTES for c in layers)


def page_cache_left(available, need, ranks_on_node):
    """The node's memory a run leaves to the page cache: what each rank may use (None: unknown) less
    what it needs, over the node's ranks."""
    return None if available is None else max(0, available - need) * ranks_on_node


def step_cost(plan, machine, page_cache_bytes=None):
    """The StepCost of one training step of `plan` (plan_run's, with its calls) on `machine`.
    page_cache_bytes: the node's memory the run leaves free for the page cache (page_cache_left;
    None: unknown, the offload files are priced at the disk's rates)."""
    shape = plan.shape
    sizes, rows, micro = shape.sizes, shape.rows, shape.micro_batches
    layers = len(sizes) - 1
    compute = micro * sum(f / machine.gemm_rate(f) for f in gemm_flops(sizes, rows))
    outputs = micro * rows * sum(sizes[1:])
    elementwise = outputs * (machine.elementwise_s if machine.elementwise_s is not None
                             else ELEMENTWISE_BYTES / machine.bandwidth)
    if shape.precision.mixed:
        weights = sum(n_in * n_out for n_in, n_out in zip(sizes, sizes[1:]))
        reduced = sum(c.nbytes // 4 for c in plan.calls if c.op in (ALLREDUCE, REDUCE_SCATTER))
        elementwise += (micro * weights * WIDEN_WEIGHT_BYTES + reduced * WIDEN_REDUCE_BYTES) / machine.bandwidth
    elementwise += quantizer_passes(plan.calls, shape.grads_quantizer) / machine.bandwidth
    owned = owned_elements(plan)
    per_element = machine.adam_s.get(shape.precision.name)
    optimizer = owned * (per_element if per_element is not None
                         else adam_bytes(shape.precision) / machine.bandwidth)
    overhead = micro * layers * machine.layer_overhead_s + machine.step_overhead_s
    seconds = [machine.call_seconds(c) for c in plan.calls]
    hidden = 0.0
    if shape.overlap.enabled:
        hidden = machine.overlap_efficiency * min(hideable_seconds(plan.calls, seconds, shape.stage),
                                                  compute * (layers - 1) / layers)
    offload = offload_seconds(plan, machine, optimizer, compute + elementwise, page_cache_bytes)
    return StepCost(compute, elementwise, optimizer, overhead, sum(seconds), hidden, offload)


def offload_seconds(plan, machine, adam_s, passes_s, page_cache_bytes):
    """The file tier's exposed I/O seconds per step (the module docstring's offload term)."""
    state = sum(b[4] for b in plan.buffers if b[5] == FILE and b[0] == "optimizer")     # S
    shard = sum(b[4] for b in plan.buffers if b[5] == FILE and b[0] == "params")        # P
    if not state + shard:
        return 0.0
    rates = machine.files
    if rates is None:
        raise CostError("the offload folder's rates were not measured: calibrate with "
                        "`python -m zerompi.plan calibrate --offload-dir DIR`")
    ranks_on_node = plan.shape.num_ranks if plan.shape.node_of_rank is None else \
        plan.shape.node_of_rank.count(plan.shape.node_of_rank[plan.rank])
    cached = page_cache_bytes is not None and (state + shard) * ranks_on_node <= page_cache_bytes
    read, write = (rates.cached_read, rates.cached_write) if cached else (rates.read, rates.write)
    e = machine.overlap_efficiency
    update = (state + shard) / read + (state + shard) / write
    tile = state * min(1.0, TILE / max(1, owned_elements(plan)))
    passes = 2 * plan.shape.micro_batches * shard / read
    layer_0 = shard / (len(plan.shape.sizes) - 1) / read
    return (update - e * min(update - tile / read - tile / write, adam_s)
            + passes - e * min(passes - layer_0, passes_s))


def hideable_seconds(calls, seconds, stage):
    """The gradient reductions but the last, and stage 3's all-gathers but the first. The step's
    metric sums (zerompi/step.py) are never hidden; stages 1-2 all-gather after AdamW, with
    nothing left to run behind."""
    grads = [s for c, s in zip(calls, seconds) if c.purpose == GRADS]
    gathers = [s for c, s in zip(calls, seconds) if c.purpose == PARAMS] if stage == 3 else []
    return sum(grads[:-1]) + sum(gathers[1:])


def cluster_machine(gemm_gflops, mem_bandwidth_gbs, intra=None, inter=None, overlap_efficiency=1.0):
    """A Machine from a cluster's numbers: intra, inter = (bandwidth GB/s, latency us) or None."""
    def link(bandwidth_latency):
        return None if bandwidth_latency is None else Link(bandwidth_latency[1] * 1e-6, bandwidth_latency[0] * 1e9)
    return Machine(gemm=((1.0, gemm_gflops * 1e9),), bandwidth=mem_bandwidth_gbs * 1e9,
                   intra=link(intra), inter=link(inter), overlap_efficiency=overlap_efficiency)
