"""ZeRO-Offload and ZeRO-Infinity: each rank's optimizer state (and stage 3's parameter shard)
outside the device's memory.

Stages 1-3 shard the Adam state (fp32 master, m, v: 12 of 16 bytes per parameter in mixed
precision) over N ranks; the state still lives in the device's memory. The ZeRO family goes
further and moves it out, keeping the mathematics: AdamW is element-wise (zerompi/adam.py), so
it can update the state a tile at a time wherever the tiles are kept.

    tier     where master, m, v live           the update                   paper
    device   the device's memory (as without)  on the device                ZeRO
    host     pinned host memory                on the CPU: the gradient     ZeRO-Offload
                                               shard host-ward, the new      (arXiv 2101.06840)
                                               parameters device-ward
    file     one file per rank (--offload-dir) on the CPU, a tile at a time  ZeRO-Infinity
                                               as the I/O thread brings it   (arXiv 2104.07857)

The file tier's pipeline: the state is cut into tiles of T elements (master, m, v of a tile
contiguous in the file), three tile buffers in memory, one I/O thread. While AdamW updates tile
i, the thread writes tile i-1 back and reads tile i+1 ahead:

    file      [ tile 0 | tile 1 | tile 2 | tile 3 | ... ]      one region of C x T elements each
                  ^ write i-1     ^ read i+1
    buffers   [ i-1: being written ] [ i: AdamW ] [ i+1: being read ]    (a ring of 3)

    main      |--AdamW 0--|--AdamW 1--|--AdamW 2--| ...       waits only when a read is late
    I/O       |r0|r1|      |w0|r2|    |w1|r3|     ...        reads ahead, writes behind

So each step reads every tile once and writes it once: 2 x (C x numel x bytes) per rank,
C = 3 columns in mixed precision (master, m, v) and 2 in full precision (the parameters are the
master and stay where the stage keeps them). The host tier moves the gradient shard to the host
(plus the fp32 parameters when there is no master) and the new parameters back.

At stage 3 the parameter shard (Psi / N) can move out too (--offload-params): params.py's
OffloadedStage3 reads each layer's shard from its tier ahead of the layer's all-gather.

    __init__.py   this page; OffloadedAdamConfig: an AdamConfig whose optimizer lives in a tier
    adam.py       OffloadedAdamW: AdamW's update over tiles, the moves between device and host
    stores.py     HostStore (an array in host memory) and FileStore (the file and its pipeline),
                  and Column: one column of a store read or written by slices outside the step
    params.py     OffloadedStage3, and its parameter shard in host memory or a file
    tiers.py      HostTier, FileTier: where each store is opened (a file is scratch)

Nothing in the stages changes: each builds its optimizer with `adam_config.optimizer(...)`; an
OffloadedAdamConfig builds an OffloadedAdamW there (and stage 3's `hold_params` is where
OffloadedStage3 puts its shard). The saved weights are bit for bit those of the run without
offload (tests/proofs/test_offload_is_bitwise_identical.py).
"""
from dataclasses import dataclass

from ..adam import AdamConfig
from .adam import OffloadedAdamW, TierTraffic
from .params import OffloadedStage3
from .stores import FILE_PREFIX, TILE, OffloadError
from .tiers import FileTier, HostTier

__all__ = ["OffloadedAdamConfig", "OffloadedAdamW", "OffloadedStage3", "TierTraffic", "FileTier", "HostTier",
           "OffloadError", "TILE", "FILE_PREFIX"]


@dataclass(frozen=True)
class OffloadedAdamConfig(AdamConfig):
    """AdamW's hyperparameters, and where its state lives: a HostTier() or FileTier(folder, rank);
    at stage 3 with OffloadedStage3, where the parameter shard lives (param_tier)."""
    tier: object = None
    tile: int = TILE             # elements per tile
    param_tier: object = None

    def optimizer(self, numel, precision, ledger):
        return OffloadedAdamW(numel, precision, self, ledger)
