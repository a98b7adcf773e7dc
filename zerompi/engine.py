"""Assembling a run: layout, ledgers, collectives, the ZeRO stage and the MLP's activations, on one rank.

    layout      = Layout(sizes, N)                 where each layer lives (zerompi/layout.py)
    memory      = MemoryLedger(comm.device)        every buffer below is allocated through it, on
                                                   the communicator's device (NumPy or CuPy)
    staging     = the communicator's work buffers  sized for the largest reduction (below)
    collectives = start_collectives(comm, overlap) at once, or on a communication thread
    stage       = STAGES[k](layout, collectives, ...)  parameters, gradients, Adam state

With --shard-group or --hpz (zerompi/hierarchy/, a layer the mainline can skip) the stage comes
from the hierarchy instead, and the layout is over the ranks that share the shards.
    mlp         = MLP(layout, batch_rows, ...)     activation buffers for this rank's rows

Staging: the communicator reduces through float32 work buffers when it cannot reduce a buffer in
place: 16-bit gradients (MPI has no bfloat16, zerompi/precision.py), a reduce-scatter that adds a
micro-batch into the gradient shard (stages 2-3), and device memory (zerompi/comm.py). They hold
the largest buffer reduced in one call: a gradient bucket in stage 0 (one all-reduce per bucket),
one layer otherwise. On a GPU without CUDA-aware MPI, pinned host memory holds the largest
collective (that, or the step's sums).
"""
from dataclasses import dataclass

import numpy as np

from .checkpoint.params import set_layer_params
from .comm import Communicator
from .layout import Layout, bucket_numel
from .hierarchy import FLAT, Grouping, hierarchy_for
from .ledger import MemoryLedger
from .model import MLP, init_layer_chunks
from .overlap import OverlapConfig, start_collectives
from .stages import STAGES
from .stages.base import ZeroStage


@dataclass
class Engine:
    layout: Layout
    comm: Communicator
    memory: MemoryLedger
    stage: ZeroStage        # a Stage0 .. Stage3
    mlp: MLP
    step_sums: object       # (layers + 2,) float64: each layer's gradient sum of squares, loss, correct
    grouping: Grouping = FLAT   # flat ZeRO, or hybrid sharding / hpZ (zerompi/hierarchy/)

    def init_params(self, seed):
        """Every rank draws the same initial values, a chunk of a layer at a time, and keeps what
        its stage keeps."""
        for layer in self.layout.layers:
            for start, values in init_layer_chunks(layer, seed):
                set_layer_params(self.stage, layer, values, start)


def build_engine(sizes, stage_number, precision, adam_config, batch_rows, comm=None, micro_batches=1,
                 overlap=OverlapConfig(), grouping=FLAT):
    comm = comm if comm is not None else Communicator()
    hierarchy = hierarchy_for(comm, grouping)             # None: flat ZeRO over all N ranks
    shard_comm = hierarchy.shard_comm if hierarchy else comm   # the ranks each layer is sharded over
    layout = Layout(sizes, shard_comm.size)
    memory = MemoryLedger(comm.device)
    buckets = layout.gradient_buckets(np.dtype(precision.storage).itemsize, overlap.bucket_mb)
    largest = (max(bucket_numel(bucket) for bucket in buckets) if stage_number == 0
               else layout.max_layer_padded)                    # elements reduced in one call
    if precision.mixed or (micro_batches > 1 and stage_number >= 2) or comm.device.is_gpu:
        shard_comm.reserve_staging(memory, largest, precision.compute)
    step_sums = memory.alloc("work", "step_sums", (len(layout.layers) + 2,), np.float64)
    comm.reserve_host_staging(memory, max(largest * precision.compute.itemsize, step_sums.nbytes))
    options = {"buckets": buckets} if stage_number <= 1 else {}   # stages 2-3 reduce layer by layer
    if hierarchy is None:
        collectives = start_collectives(comm, overlap)   # after the staging: its thread shares it
        stage = STAGES[stage_number](layout, collectives, memory, precision, adam_config, **options)
    else:                                                # zerompi/hierarchy/
        for sub in hierarchy.communicators:
            sub.reserve_host_staging(memory, largest * precision.compute.itemsize)
        stage = hierarchy.build_stage(stage_number, layout, memory, precision, adam_config, **options)
    mlp = MLP(layout, batch_rows, precision, memory, micro_batches)
    return Engine(layout, comm, memory, stage, mlp, step_sums, grouping)
