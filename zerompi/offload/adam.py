"""OffloadedAdamW: the same AdamW update, over tiles of a state kept in host memory or a file.

For each piece (lo, hi) of the owned state that the store hands out (zerompi/offload/stores.py):

    p, g   = the parameters and gradient of the piece, on the host:
             on a CPU the stage's own views; on a GPU copied device -> host into pinned tile
             buffers (the gradient; the parameters too when there is no fp32 master)
    adamw_chunked(p, g, master, m, v)     zerompi/adam.py's NumPy update, on the CPU (or, with
                                          --fused-adam, zerompi/fused/'s loop: the same numbers)
    on a GPU: the new parameters p host -> device into the stage's views

so the arithmetic is the CPU's, element by element, whatever the tier: a CPU run saves the same
weights bit for bit with or without offload, and a GPU run's update equals a CPU run fed the
same gradients. TierTraffic counts the bytes of every copy and every file read and write.
"""
from dataclasses import dataclass

import numpy as np

from ..adam import CHUNK, AdamW
from ..cpu import CPU
from .stores import host_tier


@dataclass
class TierTraffic:
    """Bytes moved between tiers by the steps so far (OffloadedAdamW.formula_per_step: one step's
    by the formula)."""
    to_host: int = 0           # device -> host (a GPU's gradients, parameters)
    to_device: int = 0         # host -> device (a GPU's new parameters)
    file_read: int = 0         # file -> host
    file_written: int = 0      # host -> file


class NoParams:
    """The parameters where the stage keeps them: nothing moved for them here."""
    bytes_read = bytes_written = to_device = 0

    def finish(self):
        """Nothing in flight."""


NO_PARAMS = NoParams()


class OffloadedAdamW(AdamW):
    """AdamW whose master, m and v are columns of a store (config.tier: HostTier or FileTier)."""
    params = None      # stage 3 with --offload-params: the HostParams or FileParams it updates (params.py)

    def __init__(self, numel, precision, config, ledger):
        self.config, self.t = config, 0
        self.device = ledger.device                      # where the parameters and gradients live
        self.precision = precision
        names = (["master"] if precision.mixed else []) + ["m", "v"]
        tile = max(1, min(numel, config.tile))
        self.store = config.tier.open(names, numel, precision.compute, tile, ledger)
        columns = self.store.columns
        self.master, self.m, self.v = columns.get("master"), columns["m"], columns["v"]
        tier = host_tier(self.device)

        def host_alloc(kind, name, shape, dtype):
            return ledger.record(kind, name, self.device.host_zeros(shape, dtype), tier)
        self.kernel = config.kernel or CPU()             # the update runs on the CPU
        self.work = self.kernel.adamw_work(min(tile, CHUNK), precision, host_alloc)
        if self.device.is_gpu:                           # the device's pieces, on the host
            self.host_grad = host_alloc("work", "offload.host_grad", (tile,), precision.storage)
            self.host_param = host_alloc("work", "offload.host_param", (tile,), precision.storage)
        self.traffic = TierTraffic()

    def begin_step(self):
        super().begin_step()
        self.store.start_step()

    def update(self, param, grad, state_slice, lr, grad_multiplier=1.0):
        decay, step_size, sqrt_bias2 = self.constants(lr)
        start = state_slice.start
        for lo, hi, tile in self.store.tiles_of(state_slice):      # tile (C, hi - lo): [master,] m, v
            p, g = param[lo - start:hi - start], grad[lo - start:hi - start]
            host_p, host_g = self.to_host(p, g)
            master = tile[0] if self.master is not None else host_p
            self.kernel.adamw(host_p, host_g, master, tile[-2], tile[-1], grad_multiplier, decay, step_size,
                              sqrt_bias2, self.config, self.work)
            if self.device.is_gpu and self.params is None:
                self.device.copy_from_host(host_p, p)
                self.traffic.to_device += host_p.nbytes

    def to_host(self, p, g):
        """The piece's parameters and gradient as host arrays (on a CPU: themselves; offloaded
        parameters are on the host already)."""
        if not self.device.is_gpu:
            return p, g
        host_g = self.host_grad[:g.size]
        self.device.copy_to_host(g, host_g)
        self.traffic.to_host += host_g.nbytes
        if self.params is not None:
            return p, host_g
        host_p = self.host_param[:p.size]
        if self.master is None:                          # no master: the parameters are it
            self.device.copy_to_host(p, host_p)
            self.traffic.to_host += host_p.nbytes
        return host_p, host_g

    def moved(self):
        """TierTraffic so far: the copies, the store's file reads and writes, and the offloaded
        parameters' (zerompi/offload/params.py)."""
        self.store.finish()
        params = self.params if self.params is not None else NO_PARAMS
        params.finish()
        return TierTraffic(self.traffic.to_host, self.traffic.to_device + params.to_device,
                           self.store.bytes_read + params.bytes_read, self.store.bytes_written + params.bytes_written)

    def formula_per_step(self, micro_batches=1):
        """What one step that updates moves, by the formula: the file tier reads and writes each
        of the C columns once (C x numel x compute bytes each way); a GPU sends the gradient (and,
        without a master, the parameters) host-ward and the parameters device-ward, numel x
        storage bytes each. Offloaded parameters (params.py): a GPU copies them device-ward for
        every all-gather (2 per micro-batch) instead; a file is read at every access
        (2 x micro_batches + 1) and written by the update."""
        compute, storage = np.dtype(self.precision.compute).itemsize, np.dtype(self.precision.storage).itemsize
        numel = self.m.size
        state = (3 if self.master is not None else 2) * numel * compute if self.store.bytes_in_file else 0
        piece = numel * storage if self.device.is_gpu else 0
        if self.params is None:
            return TierTraffic(piece * (1 if self.master is not None else 2), piece, state, state)
        shard = numel * storage if self.params.bytes_in_file else 0
        return TierTraffic(piece, 2 * micro_batches * piece, state + (2 * micro_batches + 1) * shard, state + shard)

    def close(self):
        self.store.close()
        if self.params is not None:
            self.params.close()
