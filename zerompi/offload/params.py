"""Stage 3's parameter shard outside the device's memory (ZeRO-Infinity's parameter offload).

Stage 3 reads its parameter shard (Psi / N elements) a layer at a time, three times a step: for
the forward's all-gather, for the backward's (last layer first), and for the update. With
--offload-params the shard lives in a tier instead of the device's memory:

    host   one host array (pinned on a GPU, which copies each layer's shard device-ward into a
           one-layer staging buffer before its all-gather)
    file   one scratch file per rank (zerompi/offload/tiers.py), read a layer's region at a time
           into two host buffers: while the shard in one is gathered or updated, the I/O thread
           reads the region the pass needs next into the other; the update writes each new
           region back behind it

    the pass (L layers)   F0 F1 .. F(L-1) B(L-1) .. B1 B0   (per micro-batch)   U0 U1 .. U(L-1)
    read ahead            each access starts the read of the next one in this order; the step's
                          first access (F0) reads now, its last (U(L-1)) reads nothing ahead
    buffers               [ the access now: gathered / updated ] [ the next: being read ]

    per step and rank     read  (2 x micro-batches + 1) x shard bytes  (every access: a read)
                          written                   1 x shard bytes  (by the update)
                          (a step skipped for fp16 overflow: 2 x micro-batches x shard bytes, and
                          the first layer's, read ahead for the update it did not make)

The update runs on the CPU, on the host buffer, in place (so --offload-params needs
--offload-optimizer host or file: the optimizer runs where the parameters are); OffloadedAdamW
counts these moves with its own (`params`). Outside the step (checkpoints, initial values) the
shard is a Column (zerompi/offload/stores.py), read and written by slices.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..ledger import FILE
from ..stages import Stage3
from ..stages.base import Owned
from .stores import Column, allocated_blocks, check_not_cut, host_tier, transfer


class OffloadedStage3(Stage3):
    """Stage 3 whose parameter shard is kept by adam_config.param_tier (a HostTier or FileTier)."""

    def __init__(self, layout, collectives, memory, precision, adam_config, keep_last_layer=False):
        self.tier, self.largest = adam_config.param_tier, layout.max_layer_padded // layout.num_ranks
        super().__init__(layout, collectives, memory, precision, adam_config, keep_last_layer)
        self.adam.params = self.param_shard          # the optimizer runs on it, and counts its moves
        self.ahead = None                            # the layer the pass needs after this access
        if memory.device.is_gpu:                     # the gather's send buffer on the device
            self.staging = memory.alloc("work", "offload.param_staging", (self.largest,), precision.storage)

    def hold_params(self, memory, numel, dtype):
        return self.tier.open_params(numel, dtype, self.largest, memory)

    def region(self, layer):
        """(lo, hi): where the layer's shard is in the parameter shard."""
        shard = self.layout.shard_slice(layer)
        return shard.start, shard.stop

    def owned(self, layer):
        shard = self.layout.shard_slice(layer)       # the parameters: a Column of the tier
        return Owned(self.param_shard.column(shard), self.grad_shard[shard], shard, layer.owned_range(self.rank))

    def param_shard_of(self, layer):
        """The all-gather's send buffer: the layer's shard from the tier, on the device."""
        shard = self.param_shard.fetch(self.region(layer), None if self.ahead is None else self.region(self.ahead))
        if not self.memory.device.is_gpu:
            return shard
        staging = self.staging[:shard.size]
        self.memory.device.copy_from_host(shard, staging)
        self.param_shard.to_device += shard.nbytes
        return staging

    def start_micro_batch(self, first, last=True):
        """A step's first access reads now: what the step before read ahead for an update that it
        skipped (fp16 overflow) is forgotten, so that each step reads what its formula says."""
        super().start_micro_batch(first, last)
        if first:
            self.param_shard.start_step()

    def finish_communication(self):
        super().finish_communication()
        self.ahead = None                            # outside the step nothing is read ahead

    def before_forward(self, layer):
        """Next in the pass: the following layer, or this one again (backward starts here)."""
        self.ahead = self.layout.layers[min(layer.index + 1, len(self.layout.layers) - 1)]
        return super().before_forward(layer)

    def before_backward(self, layer):
        """Next in the pass: the layer before, or layer 0 (the next forward, or the update)."""
        self.ahead = self.layout.layers[max(layer.index - 1, 0)]
        return super().before_backward(layer)

    def update(self, lr, grad_multiplier):
        """AdamW on each layer's shard in its host buffer, layer by layer, each written back."""
        self.finish_communication()
        self.adam.begin_step()
        layers = self.layout.layers
        for layer in layers:
            shard = self.layout.shard_slice(layer)
            ahead = self.region(layers[layer.index + 1]) if layer.index + 1 < len(layers) else None
            param = self.param_shard.fetch(self.region(layer), ahead)
            self.adam.update(param, self.grad_shard[shard], shard, lr, grad_multiplier)
            self.param_shard.written(self.region(layer))


class HostParams:
    """The shard in one host array (pinned beside a GPU)."""
    bytes_read = bytes_written = 0                   # no file
    bytes_in_file = False

    def __init__(self, numel, dtype, ledger):
        self.array = ledger.device.host_zeros((numel,), dtype)
        self.shard = ledger.record("params", "param_shard", Column(self, 0, numel, dtype), host_tier(ledger.device))
        self.to_device = 0                           # bytes copied to a GPU for its gathers

    def column(self, shard):
        return Column(self, 0, shard.stop - shard.start, self.array.dtype, shard.start)

    def fetch(self, region, ahead):
        return self.array[region[0]:region[1]]

    def written(self, region):
        """Nothing: the update wrote the array itself."""

    def start_step(self):
        """Nothing is read ahead, nothing is in flight."""

    def finish(self):
        """Nothing in flight."""

    def read(self, c, lo, hi):
        return self.array[lo:hi].copy()

    def write(self, c, lo, hi, values):
        self.array[lo:hi] = values

    def close(self):
        """Nothing to release but memory."""


class FileParams:
    """The shard in a file, a region (lo, hi) at a time through two host buffers and one I/O thread
    (in order: a buffer's write-back comes before the next read into it)."""
    bytes_in_file = True

    def __init__(self, fd, path, numel, dtype, largest, ledger):
        self.fd, self.path, self.dtype = fd, path, np.dtype(dtype)
        self.nbytes = numel * self.dtype.itemsize
        self.buffers = [ledger.record("work", f"offload.param_buffer{'' if i == 0 else '.2'}",
                                      ledger.device.host_zeros((largest,), dtype), host_tier(ledger.device))
                        for i in range(2)]
        self.shard = ledger.record("params", "param_shard", Column(self, 0, numel, dtype), FILE)
        self.io = ThreadPoolExecutor(1, thread_name_prefix="zerompi-offload-params")
        self.holds = [None, None]        # the region each buffer holds, or is being read into
        self.reads = [None, None]        # the read (a future) that last filled each buffer
        self.writes = [None, None]       # the write-back that last emptied it
        self.current = 0                 # the buffer of the access now
        self.blocks = allocated_blocks(fd, self.nbytes)
        self.bytes_read = self.bytes_written = self.to_device = 0
        self.io_seconds = self.waited_seconds = 0.0  # the I/O thread's time in them; the step's waiting

    def column(self, shard):
        return Column(self, 0, shard.stop - shard.start, self.dtype, shard.start)

    def fetch(self, region, ahead):
        """The host buffer (hi - lo,) holding the region: read ahead by the access before, or read
        now; then the read of `ahead` (a region, or None) starts into the other buffer."""
        k = 1 - self.current                         # the buffer read ahead into
        if self.holds[k] != region:                  # not what was read ahead: read it now
            self.start_read(k, region)
        waiting = time.perf_counter()
        self.reads[k].result()                       # its read done, errors raised here
        if self.writes[k] is not None:               # the write-back queued before that read
            self.writes[k].result()
        self.waited_seconds += time.perf_counter() - waiting
        self.current = k
        if ahead is not None:
            self.start_read(1 - k, ahead)
        return self.buffers[k][:region[1] - region[0]]

    def start_read(self, k, region):
        self.holds[k] = region
        self.reads[k] = self.io.submit(self.read_region, k, region)

    def written(self, region):
        """The update has written the current buffer's region: write it back behind."""
        self.writes[self.current] = self.io.submit(self.write_region, self.current, region)

    def read_region(self, k, region):
        """I/O thread: the region from the file into buffer k."""
        buffer = self.buffers[k][:region[1] - region[0]]
        start = time.perf_counter()
        transfer(self.fd, self.path, os.preadv, buffer, region[0] * self.dtype.itemsize, "read")
        self.io_seconds += time.perf_counter() - start
        self.bytes_read += buffer.nbytes

    def write_region(self, k, region):
        buffer = self.buffers[k][:region[1] - region[0]]
        start = time.perf_counter()
        transfer(self.fd, self.path, os.pwritev, buffer, region[0] * self.dtype.itemsize, "write")
        self.io_seconds += time.perf_counter() - start
        self.bytes_written += buffer.nbytes

    def finish(self):
        """Wait for every read and write in flight (re-raising the first error); check the file."""
        for future in self.reads + self.writes:
            if future is not None:
                future.result()
        check_not_cut(self.fd, self.path, self.nbytes, self.blocks)

    def read(self, c, lo, hi):
        self.finish()
        out = np.empty(hi - lo, self.dtype)
        transfer(self.fd, self.path, os.preadv, out, lo * self.dtype.itemsize, "read")
        return out

    def write(self, c, lo, hi, values):
        self.finish()
        transfer(self.fd, self.path, os.pwritev, np.ascontiguousarray(values), lo * self.dtype.itemsize, "write")
        self.forget_ahead()                          # what the buffers hold may be stale now

    def forget_ahead(self):
        self.holds = [None, None]

    def start_step(self):
        """The last step's write-backs done, and the file checked whole (a cut that they filled
        again leaves holes: zerompi/offload/stores.py's check_not_cut); nothing read ahead."""
        self.finish()
        self.forget_ahead()

    def close(self):
        try:
            self.finish()
        finally:
            self.io.shutdown()
            if self.fd is not None:
                os.close(self.fd)
