"""Reading a checkpoint's shard files: any element range of any layer and kind.

Every shard file is a standard .npy holding a 1-D array of the writer's shard_numel elements
(bfloat16 as its uint16 words, which .npy can describe; the manifest names the real dtype).
Element g of layer u (0 <= g < padded) was owned by rank k = g // shard_size and sits at position
shard_offset(u) + g % shard_size of rank k's file: so any range of any layer can be read from the
files of the ranks that owned it, with no other rank's data. Elements at and beyond the layer's
numel are padding (zeros): a reader with another N pads to its own multiple instead.

Integrity: each file's data is cut into blocks of `block_bytes`, and the manifest keeps a CRC-32
of each. A reader verifies every block it touches (at most one block more than it needs at
each end of a range); `python -m zerompi.checkpoint inspect` verifies them all.
"""
import os
import zlib

import numpy as np

from .files import CheckpointError, dtype_named, on_disk
from .manifest import read_manifest, unverified_note
from ..util.inputs import check_fits, open_regular
from ..precision import BF16


class CheckpointReader:
    """Reads element ranges of any layer and kind, from the files of the ranks that owned them."""

    def __init__(self, folder):
        self.folder = folder
        self.manifest = read_manifest(folder)
        m = self.manifest
        self.note = unverified_note(folder, m)
        self.layers = m["units"]
        self.kinds = {kind: dtype_named(name) for kind, name in m["kinds"].items()}
        self.files = {(f["rank"], f["kind"]): f for f in m["files"]}
        self.arrays = {}          # (rank, kind) -> memory map of the file's data
        self.verified = set()     # (rank, kind, block) already checked against its CRC

    def _array(self, rank, kind):
        """The file's data, mapped; first checks that the file is a regular file of the size the
        manifest gives it."""
        key = (rank, kind)
        if key not in self.arrays:
            entry = self.files[key]
            path = os.path.join(self.folder, entry["path"])
            disk_dtype = on_disk(np.empty(0, self.kinds[kind])).dtype
            if not os.path.lexists(path):
                raise CheckpointError(f"{path}: missing (rank {rank}'s {kind} shard)")
            with open_regular(path, CheckpointError) as f:
                size = os.fstat(f.fileno()).st_size
                expected = entry["data_offset"] + entry["data_bytes"]
                if size != expected:
                    raise CheckpointError(f"{path}: {size} bytes, the manifest says {expected}: truncated or replaced")
                try:
                    self.arrays[key] = np.memmap(f, dtype=disk_dtype, mode="r", offset=entry["data_offset"],
                                                 shape=(entry["data_bytes"] // disk_dtype.itemsize,))
                except (OSError, ValueError) as e:
                    raise CheckpointError(f"{path}: cannot be mapped ({e})") from None
        return self.arrays[key]

    def _verify(self, rank, kind, lo, hi):
        """Check the CRC of every block that elements [lo, hi) of the file touch."""
        data = self._array(rank, kind)
        entry = self.files[(rank, kind)]
        block, itemsize = self.manifest["block_bytes"], data.dtype.itemsize
        raw = data.view(np.uint8)
        for b in range(lo * itemsize // block, (hi * itemsize - 1) // block + 1):
            if (rank, kind, b) in self.verified:
                continue
            if zlib.crc32(raw[b * block:(b + 1) * block]) != entry["crc32"][b]:
                raise CheckpointError(f"{os.path.join(self.folder, entry['path'])}: checksum mismatch in "
                                      f"block {b} (bytes {b * block}..{(b + 1) * block}): the file is corrupted")
            self.verified.add((rank, kind, b))

    def read_range(self, layer_index, kind, lo, hi, dtype):
        """Elements [lo, hi) of the layer's flat buffer (weight then bias), as dtype; positions at
        or beyond the layer's numel (padding) are zero. The files the range lies in are checked,
        and the result's size against the memory available, before it is allocated."""
        layer = self.layers[layer_index]
        shard, end = layer["shard_size"], min(hi, layer["numel"])
        for rank in range(lo // shard, (end - 1) // shard + 1 if end > lo else 0):
            self._array(rank, kind)
        check_fits((hi - lo) * np.dtype(dtype).itemsize,
                   f"{self.folder}: layer {layer_index}'s {kind}, elements {lo}..{hi},", CheckpointError)
        out = np.zeros(hi - lo, dtype=dtype)
        g = lo
        while g < end:                                   # one run per writer rank the range crosses
            rank = g // shard
            run_end = min(end, (rank + 1) * shard)
            start = layer["shard_offset"] + g - rank * shard
            stop = start + run_end - g
            self._verify(rank, kind, start, stop)
            values = self._array(rank, kind)[start:stop]
            if self.kinds[kind] == BF16:
                values = values.view(BF16)
            out[g - lo:run_end - lo] = values
            g = run_end
        return out
