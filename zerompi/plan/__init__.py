"""The plan of a run: what each rank will allocate and communicate, known before anything is.

A plan builds the run's own engine (zerompi/engine.py's build_engine: the same layout, stage,
Adam state, staging and activation buffers, by the same code) for one rank of N, on a
VirtualDevice and a PlannedCommunicator (zerompi/plan/virtual.py): buffers that take no memory,
collectives that move nothing. Then

    memory       = that engine's MemoryLedger: params, grads, optimizer, work, activations,
                   buffer by buffer, exactly what the run's ledger will count
    collectives  = the stage's hooks driven through one step, in the training step's order
                   (zerompi/step.py, without its arithmetic), plus the step's one all-reduce of
                   its sums: the CommLedger of one step, and each call as MPI would get it

          plan_run(sizes, stage, precision, rows, N, ...)          no MPI, no memory
                |                                  |
          engine.memory (per rank, by kind)   one step's CommLedger + PlannedCalls
                |                                  |
          the preflight (preflight.py)        --dry-run (zerompi/train/commands/dry_run.py), the cost model (zerompi/train/commands/cost.py)

A run's ledger equals its plan for everything the ledger counts (tests/reference/test_plan_equals_ledger.py
runs both for every stage, N = 1, 2, 3, 4, 8, hybrid sharding and hpZ). The plan of a GPU run
leaves out pinned host staging (host memory; MPI that is CUDA-aware needs none).
"""
from dataclasses import dataclass, field

from ..adam import AdamConfig
from ..engine import build_engine
from ..hierarchy import FLAT, hierarchy_for
from ..ledger import METRICS
from ..offload import FileTier, OffloadedAdamConfig, OffloadedStage3
from ..overlap import OverlapConfig
from ..quantize import quantized_collectives, two_hop_node_size
from .virtual import PlannedCommunicator, VirtualDevice


@dataclass(frozen=True)
class RunShape:
    """What a run's memory and collectives depend on."""
    sizes: tuple                     # layer widths, input first: (features, *hidden, classes)
    stage: int
    precision: object                # zerompi/precision.py's Precision
    rows: int                        # this rank's rows of one micro-batch
    num_ranks: int
    micro_batches: int = 1           # --grad-accum
    grouping: object = FLAT          # flat, hybrid sharding or hpZ (zerompi/hierarchy/)
    overlap: object = OverlapConfig()
    node_of_rank: tuple = None       # None: all ranks on one node
    reads_layers: bool = False       # starts from --init-weights or a checkpoint: whole layers read
    watchdog: bool = False           # --collective-timeout: a watchdog thread for each communicator
    offload: object = None           # where the optimizer state lives (zerompi/offload/: HostTier,
                                     # FileTier); None: the device's memory
    offload_params: object = None    # where stage 3's parameter shard lives (the same tiers)
    weights_quantizer: object = None  # qwZ's Quantizer (zerompi/quantize/); None: exact all-gathers
    grads_quantizer: object = None    # qgZ's; None: exact reduce-scatters
    quant_error: bool = False         # their error measured each step beside exact calls (--quant-error)
    adam_kernel: object = None        # what runs AdamW (zerompi/fused/'s FusedAdamKernel); None: the device
    keep_last_layer: bool = False     # stage 3 keeps the last layer gathered into backward (--keep-last-layer)

    @property
    def start_collectives(self):
        """build_engine's: the overlap's (zerompi/overlap/), or qwZ's and qgZ's (zerompi/quantize/)."""
        if self.weights_quantizer is None and self.grads_quantizer is None:
            return self.overlap.start
        nodes = two_hop_node_size(self.node_of_rank) if self.node_of_rank else None    # qgZ's two hops
        return quantized_collectives(self.weights_quantizer, self.grads_quantizer, nodes, self.quant_error)

    @property
    def num_params(self):
        return sum((n_in + 1) * n_out for n_in, n_out in zip(self.sizes, self.sizes[1:]))


@dataclass
class RunPlan:
    shape: RunShape
    rank: int
    bytes_by_kind: dict              # MEMORY_KINDS -> bytes this rank allocates in the device's memory
    buffers: list                    # (kind, name, shape, dtype, nbytes, tier) of each, as the ledger lists them
    ledger: object = None            # one step's CommLedger (None: memory only)
    calls: list = field(default_factory=list)   # one step's PlannedCalls, in order
    threads: int = 0                 # threads the engine starts: --overlap's, the new communicators' watchdogs,
                                     # the file tier's I/O thread

    @property
    def total_bytes(self):
        return sum(self.bytes_by_kind.values())

    def tier_bytes(self, tier):
        """Bytes this rank keeps in a tier (zerompi.ledger's DEVICE, HOST, FILE)."""
        return sum(b[4] for b in self.buffers if b[5] == tier)


def build_planned_engine(shape, rank=0, device=None):
    """The engine rank `rank` of the run would build, on buffers that take no memory."""
    comm = PlannedCommunicator(shape.num_ranks, rank, shape.node_of_rank, VirtualDevice(device) if device else None)
    params = shape.offload_params
    adam = (OffloadedAdamConfig(tier=shape.offload.planned(), param_tier=params and params.planned(),
                                kernel=shape.adam_kernel) if shape.offload else AdamConfig(kernel=shape.adam_kernel))
    return build_engine(list(shape.sizes), shape.stage, shape.precision, adam, shape.rows, comm,
                        shape.micro_batches, shape.overlap.bucket_mb, shape.start_collectives,
                        hierarchy_for(comm, shape.grouping), OffloadedStage3 if params else None, shape.keep_last_layer)


def plan_memory(shape, rank=0, device=None):
    """What rank `rank` will allocate, by kind (no collectives: see plan_run). device: the run's
    (zerompi/devices/), the CPU by default."""
    return _plan(build_planned_engine(shape, rank, device), shape, rank)


def plan_run(shape, rank=0, device=None):
    """plan_memory, and the collectives of one training step."""
    engine = build_planned_engine(shape, rank, device)
    step_collectives(engine, shape.micro_batches)
    if shape.quant_error:                       # the run's per-step sum of the errors (zerompi/quantize/error.py)
        engine.stage.collectives.error.step_errors()
    return _plan(engine, shape, rank, engine.comm.ledger, list(engine.comm.calls))


def _plan(engine, shape, rank, ledger=None, calls=()):
    engine.stage.collectives.close()            # --overlap: the plan's communication thread ends
    threads = ((len(engine.comm.made) - 1) * shape.watchdog + shape.overlap.enabled   # the world's watchdog runs already
               + isinstance(shape.offload, FileTier) + isinstance(shape.offload_params, FileTier))   # the
    # file tier's I/O threads (zerompi/offload/)
    return RunPlan(shape, rank, dict(engine.memory.bytes_by_kind), list(engine.memory.buffers), ledger, list(calls),
                   threads)


def step_collectives(engine, micro_batches):
    """The collectives of one step of zerompi/step.py's train_step, in its order: each stage hook
    it calls, without the layers' arithmetic and Adam (they communicate nothing)."""
    stage = engine.stage
    layers = engine.layout.layers
    for k in range(micro_batches):
        stage.start_micro_batch(first=k == 0, last=k == micro_batches - 1)
        for layer in layers:
            stage.before_forward(layer)
            stage.after_forward(layer)
        for layer in reversed(layers):
            stage.before_backward(layer)
            stage.after_backward(layer)
    stage.reduce_grads()
    engine.comm.allreduce_sum(engine.step_sums, METRICS)
    stage.gather_params()
    stage.finish_communication()
