"""ZeRO-Offload and ZeRO-Infinity: the optimizer state of each rank outside the device's memory.

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

    __init__.py   this page; OffloadedAdamConfig: an AdamConfig whose optimizer lives in a tier
    adam.py       OffloadedAdamW: AdamW's update over tiles, the moves between device and host
    stores.py     HostStore (an array in host memory) and FileStore (the file and its pipeline),
                  and Column: one column of a store read or written by slices outside the step

Nothing in the stages changes: each builds its optimizer with `adam_config.optimizer(...)`; an
OffloadedAdamConfig builds an OffloadedAdamW there. The saved weights are bit for bit those of
the run without offload (tests/proofs/test_offload_is_bitwise_identical.py).
"""
from dataclasses import dataclass

from ..adam import AdamConfig
from .adam import OffloadedAdamW, TierTraffic
from .stores import FILE_PREFIX, TILE, FileTier, HostTier, OffloadError

__all__ = ["OffloadedAdamConfig", "OffloadedAdamW", "TierTraffic", "FileTier", "HostTier", "OffloadError",
           "TILE", "FILE_PREFIX"]


@dataclass(frozen=True)
class OffloadedAdamConfig(AdamConfig):
    """AdamW's hyperparameters, and where its state lives: a HostTier() or FileTier(folder, rank)."""
    tier: object = None
    tile: int = TILE             # elements per tile

    def optimizer(self, numel, precision, ledger):
        return OffloadedAdamW(numel, precision, self, ledger)
