"""Assembling a run: layout, ledgers, collectives, the ZeRO stage and the MLP's activations, on one rank.

    layout      = Layout(sizes, N)                 where each layer lives (zerompi/layout.py)
    memory      = MemoryLedger(comm.device)        every buffer below is allocated through it, on
                                                   the communicator's device (NumPy or CuPy)
    staging     = the communicator's work buffers  sized for the largest reduction (below)
    collectives = start_collectives(comm)          Collectives(comm): each call runs at once
    stage       = STAGES[k](layout, collectives, ...)  parameters, gradients, Adam state
    mlp         = MLP(layout, batch_rows, ...)     activation buffers for this rank's rows

Layers a first reading can skip are handed in, never imported: `start_collectives` may run the
calls on a communication thread instead (zerompi/overlap/: `OverlapConfig.start`), and with
--shard-group or --hpz a `hierarchy` (zerompi/hierarchy/: `hierarchy_for`, which splits the
communicator first) builds the stage over the ranks that share the shards; with --offload-params
`stage_class` is zerompi/offload/'s OffloadedStage3.

What differs between stages here each stage class declares (zerompi/stages/base.py): whether it
takes gradient buckets, the largest reduction it makes, whether a reduce-scatter adds into its
gradient shard.

Staging: the communicator reduces through float32 work buffers when it cannot reduce a buffer in
place: 16-bit gradients (MPI has no bfloat16, zerompi/precision.py), a reduce-scatter that adds a
micro-batch into the gradient shard (stages 2-3), and device memory (zerompi/comm.py). They hold
the largest buffer reduced in one call: a gradient bucket in stage 0 (one all-reduce per bucket),
one layer otherwise. On a GPU without CUDA-aware MPI, pinned host memory holds the largest
collective (that, or the step's sums).
"""
from dataclasses import dataclass

import numpy as np

from .collectives import Collectives
from .comm import Communicator
from .layout import Layout
from .ledger import MemoryLedger
from .model import MLP, init_layer_chunks
from .stages import STAGES
from .stages.base import ZeroStage
from .stages.params import set_layer_params

BUCKET_MB = 4.0        # stages 0-1 hand gradients to communication in buckets of at least this


@dataclass
class Engine:
    layout: Layout
    comm: Communicator
    memory: MemoryLedger
    stage: ZeroStage        # a Stage0 .. Stage3
    mlp: MLP
    step_sums: object       # (layers + 2,) float64: each layer's gradient sum of squares, loss, correct

    def init_params(self, seed):
        """Every rank draws the same initial values, a chunk of a layer at a time, and keeps what
        its stage keeps."""
        for layer in self.layout.layers:
            for start, values in init_layer_chunks(layer, seed):
                set_layer_params(self.stage, layer, values, start)


def build_engine(sizes, stage_number, precision, adam_config, batch_rows, comm=None, micro_batches=1,
                 bucket_mb=BUCKET_MB, start_collectives=Collectives, hierarchy=None, stage_class=None,
                 keep_last_layer=False):
    comm = comm if comm is not None else Communicator()
    shard_comm = hierarchy.shard_comm if hierarchy else comm   # the ranks each layer is sharded over
    if stage_class is None:                                    # (or zerompi/offload/'s OffloadedStage3)
        stage_class = hierarchy.stage_class(stage_number) if hierarchy else STAGES[stage_number]
    layout = Layout(sizes, shard_comm.size)
    memory = MemoryLedger(comm.device)
    buckets = layout.gradient_buckets(np.dtype(precision.storage).itemsize, bucket_mb)
    largest = stage_class.largest_reduction(layout, buckets)   # elements reduced in one call
    if precision.mixed or (micro_batches > 1 and stage_class.reduce_scatter_adds) or comm.device.is_gpu:
        shard_comm.reserve_staging(memory, largest, precision.compute)
    step_sums = memory.alloc("work", "step_sums", (len(layout.layers) + 2,), np.float64)
    comm.reserve_host_staging(memory, max(largest * precision.compute.itemsize, step_sums.nbytes))
    options = {"buckets": buckets} if stage_class.takes_buckets else {}
    options.update({"keep_last_layer": True} if keep_last_layer else {})     # stage 3's (zerompi/stages/stage3.py)
    if hierarchy is None:
        collectives = start_collectives(comm)      # after the staging: a communication thread shares it
        stage = stage_class(layout, collectives, memory, precision, adam_config, **options)
    else:                                           # zerompi/hierarchy/
        for sub in hierarchy.communicators:
            sub.reserve_host_staging(memory, largest * precision.compute.itemsize)
        stage = hierarchy.build_stage(stage_number, layout, memory, precision, adam_config, start_collectives,
                                      **options)
    mlp = MLP(layout, batch_rows, precision, memory, micro_batches)
    return Engine(layout, comm, memory, stage, mlp, step_sums)
