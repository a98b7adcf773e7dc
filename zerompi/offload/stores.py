"""Where the offloaded state lives: host memory or a file, read and written in tiles.

A store holds C columns (master, m, v; or m, v) of numel elements each, in the compute dtype,
and answers two questions:

    tiles_of(state)      during the step: the pieces (lo, hi, view (C, hi - lo)) of the slice
                         `state`, in order; the updates write into the views
    read(c, lo, hi)      outside the step (checkpoints, initial values): a copy of column c's
    write(c, lo, hi, x)  elements lo .. hi - 1, or x written there (Column wraps both as slices)

HostStore: one (C, numel) array in host memory (pinned on a GPU); a piece is a view into it, and a
Column's slice is read from it and written into it (a GPU's values first copied to the host).
FileStore: one file, tile k's C x T elements contiguous at offset k C T bytes-per-element, and
the pipeline of zerompi/offload/__init__.py: `start_step` reads tiles 0 and 1 ahead; when AdamW
has finished tile k, its write and the read of tile k + 2 are queued on the I/O thread (one
thread, in order, so tile k + 2's read into tile k - 1's buffer comes after that buffer's write).

The file is scratch, never a checkpoint (made by zerompi/offload/tiers.py).
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..device import to_numpy
from ..ledger import DEVICE, FILE, HOST

TILE = 1 << 18                # elements per tile: 1 MiB per float32 column (3 buffers of C columns)
BUFFERS = 3                   # tile buffers of the file tier: being written, being updated, being read
FILE_PREFIX = "zerompi-offload"


class OffloadError(Exception):
    """An offload file that cannot be created, read or written: one line."""


def host_tier(device):
    """The ledger's tier of host memory: the device's own on a CPU, HOST beside a GPU."""
    return HOST if device.is_gpu else DEVICE


class Column:
    """Column c of a store (or its numel elements from `start`) as an array that is read and
    written by slices (`adam.m[lo:hi]`, `adam.m[lo:hi] = x`, `[...]`): what checkpoints and initial
    values use; `get()` reads it all, as a GPU array's does (zerompi/device.py's to_numpy)."""

    def __init__(self, store, c, numel, dtype, start=0):
        self.store, self.c, self.start = store, c, start
        self.shape, self.size, self.dtype = (numel,), numel, np.dtype(dtype)
        self.nbytes = numel * self.dtype.itemsize

    def range(self, index):
        lo, hi, step = (slice(None) if index is Ellipsis else index).indices(self.size)
        if step != 1:
            raise IndexError("an offloaded column is read by contiguous slices")
        return self.start + lo, self.start + max(lo, hi)

    def __getitem__(self, index):
        return self.store.read(self.c, *self.range(index))

    def __setitem__(self, index, values):
        lo, hi = self.range(index)
        self.store.write(self.c, lo, hi, np.broadcast_to(to_numpy(values).astype(self.dtype, copy=False), (hi - lo,)))

    def get(self):
        return self[:]


def transfer(fd, path, call, buffer, offset, what):
    """One pread or pwrite of the whole buffer at offset (a short one is an error); its seconds."""
    start = time.perf_counter()
    try:
        done = call(fd, [buffer], offset)
    except OSError as e:
        raise OffloadError(f"cannot {what} the offload file {path}: {e.strerror}") from None
    if done != buffer.nbytes:
        raise OffloadError(f"the offload file {path} is shorter than this run made it "
                           f"({what} of {buffer.nbytes} bytes at {offset} got {done}): truncated?")
    return time.perf_counter() - start


def allocated_blocks(fd, nbytes):
    """st_blocks after posix_fallocate: a cut that later writes filled again leaves holes, which
    lower it (checked where the file system allocated it all, as ext4, xfs and tmpfs do; else 0)."""
    blocks = os.fstat(fd).st_blocks if fd is not None else 0
    return blocks if blocks * 512 >= nbytes else 0


def check_not_cut(fd, path, nbytes, blocks):
    """An OffloadError if the file is shorter than nbytes, or has fewer blocks than it was given."""
    status = os.fstat(fd) if fd is not None else None      # None: a plan's store
    if status is not None and (status.st_size < nbytes or status.st_blocks < blocks):
        raise OffloadError(f"the offload file {path} is shorter than this run made it (cut to "
                           f"{status.st_size} bytes, or holes in it): truncated?")


class HostStore:
    bytes_read = bytes_written = 0      # no file
    bytes_in_file = False

    def __init__(self, names, numel, dtype, tile, ledger):
        self.state = ledger.device.host_zeros((len(names), numel), dtype)   # (C, numel)
        self.tile = tile
        self.columns = {name: ledger.record("optimizer", f"adam.{name}", Column(self, c, numel, dtype),
                                            host_tier(ledger.device)) for c, name in enumerate(names)}

    def start_step(self):
        """Nothing to bring in: the state is in memory."""

    def tiles_of(self, state):
        for lo in range(state.start, state.stop, self.tile):
            hi = min(lo + self.tile, state.stop)
            yield lo, hi, self.state[:, lo:hi]

    def finish(self):
        """Nothing in flight."""

    def read(self, c, lo, hi):
        return self.state[c, lo:hi].copy()

    def write(self, c, lo, hi, values):
        self.state[c, lo:hi] = values          # host values (Column took them off a GPU)

    def close(self):
        """Nothing to release but memory."""


class FileStore:
    bytes_in_file = True

    def __init__(self, fd, path, names, numel, dtype, tile, ledger):
        self.fd, self.path = fd, path
        self.numel, self.tile, self.dtype = numel, tile, np.dtype(dtype)
        self.count = len(names)                          # C columns
        self.buffers = [ledger.record("work", f"offload.tile_buffer{'' if i == 0 else f'.{i + 1}'}",
                                      ledger.device.host_zeros((self.count * tile,), dtype),
                                      host_tier(ledger.device)) for i in range(min(BUFFERS, self.tile_count))]
        self.columns = {name: ledger.record("optimizer", f"adam.{name}", Column(self, c, numel, dtype), FILE)
                        for c, name in enumerate(names)}
        self.io = ThreadPoolExecutor(1, thread_name_prefix="zerompi-offload-io")
        self.reads = [None] * BUFFERS       # the read (a future) that last filled each buffer
        self.writes = [None] * BUFFERS      # the write that last emptied it
        self.cursor = numel                 # the next element the step updates (numel: no step)
        self.blocks = allocated_blocks(fd, self.count * numel * self.dtype.itemsize)
        self.bytes_read = self.bytes_written = 0     # by the step's reads and writes
        self.io_seconds = self.waited_seconds = 0.0  # the I/O thread's time in them; AdamW's waiting

    def tile_range(self, k):
        return k * self.tile, min((k + 1) * self.tile, self.numel)

    def offset(self, k):
        return k * self.tile * self.count * self.dtype.itemsize

    def start_step(self):
        self.finish()
        self.cursor = 0
        for k in range(min(2, self.tile_count)):
            self.read_ahead(k)

    @property
    def tile_count(self):
        return -(-self.numel // self.tile)

    def read_ahead(self, k):
        if k < self.tile_count:
            self.reads[k % BUFFERS] = self.io.submit(self.read_tile, k)

    def tiles_of(self, state):
        if state.start != self.cursor:
            raise RuntimeError("the offloaded state is updated once per step, in order")
        while self.cursor < state.stop:
            k = self.cursor // self.tile
            lo, hi = self.tile_range(k)
            waiting = time.perf_counter()
            tile = self.reads[k % BUFFERS].result()       # waits for tile k's read; raises its error
            self.waited_seconds += time.perf_counter() - waiting
            if self.writes[k % BUFFERS] is not None:      # tile k - 3's write came before this read:
                self.writes[k % BUFFERS].result()         # done, and its error raised here
            end = min(hi, state.stop)
            yield self.cursor, end, tile[:, self.cursor - lo:end - lo]
            self.cursor = end
            if end == hi:                                 # tile k is done: write it, read k + 2
                self.writes[k % BUFFERS] = self.io.submit(self.write_tile, k)
                self.read_ahead(k + 2)

    def read_tile(self, k):
        """I/O thread: tile k into its buffer; returns the buffer as (C, n)."""
        lo, hi = self.tile_range(k)
        buffer = self.buffers[k % BUFFERS][:self.count * (hi - lo)]
        self.io_seconds += self.transfer(os.preadv, buffer, self.offset(k), "read")
        self.bytes_read += buffer.nbytes
        return buffer.reshape(self.count, hi - lo)

    def write_tile(self, k):
        lo, hi = self.tile_range(k)
        buffer = self.buffers[k % BUFFERS][:self.count * (hi - lo)]
        self.io_seconds += self.transfer(os.pwritev, buffer, self.offset(k), "write")
        self.bytes_written += buffer.nbytes

    def transfer(self, call, buffer, offset, what):
        return transfer(self.fd, self.path, call, buffer, offset, what)

    def finish(self):
        """Wait for every read and write in flight (re-raising the first error): the thread runs
        them in order, so the last ones queued for the three buffers are the last of all."""
        for future in self.reads + self.writes:
            if future is not None:
                future.result()
        check_not_cut(self.fd, self.path, self.count * self.numel * self.dtype.itemsize, self.blocks)

    def pieces(self, c, lo, hi):
        """(file offset, lo, hi) of column c's elements lo .. hi - 1, one per tile they touch."""
        for k in range(lo // self.tile, -(-hi // self.tile)):
            first, last = self.tile_range(k)
            a, b = max(lo, first), min(hi, last)
            yield self.offset(k) + (c * (last - first) + a - first) * self.dtype.itemsize, a, b

    def read(self, c, lo, hi):
        self.finish()
        out = np.empty(hi - lo, self.dtype)
        for offset, a, b in self.pieces(c, lo, hi):
            self.transfer(os.preadv, out[a - lo:b - lo], offset, "read")
        return out

    def write(self, c, lo, hi, values):
        self.finish()
        values = np.ascontiguousarray(values)
        for offset, a, b in self.pieces(c, lo, hi):
            self.transfer(os.pwritev, values[a - lo:b - lo], offset, "write")

    def close(self):
        """Wait for the I/O thread, then close the file (already unlinked: the kernel frees it)."""
        try:
            self.finish()
        finally:
            self.io.shutdown()
            if self.fd is not None:          # None: a plan's store
                os.close(self.fd)
