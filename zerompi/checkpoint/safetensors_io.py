"""safetensors, written and read one tensor at a time (the format PyTorch, JAX and NumPy users load).

The format (https://github.com/huggingface/safetensors):

    | 8 bytes: header length H, little-endian u64 | H bytes: JSON header | tensor data ... |
    header: {"name": {"dtype": "F32", "shape": [O, I], "data_offsets": [begin, end]}, ...,
             "__metadata__": {"key": "value", ...}}
    offsets are relative to the start of the data; tensors are C-ordered, little-endian.

The reader refuses, with one line naming the file, what the format does not allow: a header
length beyond the file or beyond 100 MB (the reference implementation's limit), a header that is
not a JSON object (or nested too deep to parse), a tensor whose byte count does not fit its
shape and dtype, and offsets that do not tile the data exactly: sorted by begin, the first
begins at 0, each begins where the previous ends (no overlap, no gap), and the last ends at the
end of the file. The file is opened only if it is a regular file (zerompi/util/inputs.py).

The header is computed first from the names, shapes and dtypes, so the data can then be streamed:
no more than one tensor is ever in memory. The file is written atomically
(zerompi/util/atomic.py). bfloat16 is stored as "BF16" (its raw 16-bit words), which PyTorch
and JAX read natively; this reader returns it as ml_dtypes.bfloat16, and safetensors.numpy reads it
only once ml_dtypes is imported (it registers bfloat16 with NumPy).
"""
import json
import math
import os
import struct

import ml_dtypes
import numpy as np

from ..util.atomic import atomic_file
from ..util.inputs import check_fits, open_regular

DTYPE_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
               np.dtype(ml_dtypes.bfloat16): "BF16"}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A file that is not valid safetensors; str(e) names the file and the problem."""


def write_safetensors(path, specs, tensors, metadata=None):
    """specs: [(name, shape, dtype), ...] in order; tensors: an iterable yielding each array in that
    order (a generator, so that only one is in memory). Atomic: tmp file, fsync, rename."""
    header, offset = {}, 0
    for name, shape, dtype in specs:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": DTYPE_CODES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)                    # align the data to 8 bytes
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for (name, shape, dtype), tensor in zip(specs, tensors, strict=True):
            tensor = np.ascontiguousarray(tensor, dtype=dtype)
            if tensor.shape != tuple(shape):
                raise ValueError(f"{name}: shape {tensor.shape}, header says {tuple(shape)}")
            f.write(memoryview(tensor.view(np.uint8).reshape(-1)))


def read_header(path):
    """(header dict without __metadata__, metadata, data start) of a safetensors file, checked
    as the module docstring says."""
    try:
        with open_regular(path, SafetensorsError) as f:
            size = os.fstat(f.fileno()).st_size
            length = struct.unpack("<Q", f.read(8))[0]
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise SafetensorsError(f"{path}: header length {length} exceeds the file ({size} bytes) or the "
                                       f"format's limit ({MAX_HEADER_BYTES} bytes)")
            header = json.loads(f.read(length))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SafetensorsError(f"{path}: not a safetensors file ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    data_start, data_bytes = 8 + length, size - 8 - length
    spans = sorted((_span(path, name, entry), name) for name, entry in header.items())
    end, previous = 0, None
    for (begin, stop), name in spans:
        if begin < end:
            raise SafetensorsError(f"{path}: tensors {previous!r} and {name!r} overlap (the first ends at "
                                   f"{end}, the second begins at {begin})")
        if begin > end:
            raise SafetensorsError(f"{path}: a gap before tensor {name!r}: bytes {end}..{begin} of the data "
                                   f"belong to no tensor")
        end, previous = stop, name
    if end != data_bytes:
        raise SafetensorsError(f"{path}: {data_bytes - end} bytes after the last tensor's data: the offsets do "
                               f"not cover the {data_bytes} data bytes" if end < data_bytes else
                               f"{path}: tensor {previous!r} ends at {end}, beyond the {data_bytes} data bytes")
    return header, metadata, data_start


def _span(path, name, entry):
    """(begin, end) of a tensor's entry, checked against its dtype and shape."""
    try:
        dtype = CODE_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in [begin, end, *shape]):
            raise TypeError("offsets and shape must be non-negative integers")
    except (KeyError, TypeError, ValueError) as e:
        raise SafetensorsError(f"{path}: tensor {name!r} has an unsupported or malformed entry {entry} "
                               f"({e})") from None
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise SafetensorsError(f"{path}: tensor {name!r} has data offsets {entry['data_offsets']} that do "
                               f"not fit its shape {shape} ({dtype.name})")
    return begin, end


def read_tensor(path, header, data_start, name):
    """One tensor, read from disk into a new array (the file is not kept open)."""
    entry = header[name]
    dtype = CODE_DTYPES[entry["dtype"]]
    begin, end = entry["data_offsets"]
    check_fits(end - begin, f"{path}: tensor {name!r}", SafetensorsError)
    out = np.empty(end - begin, dtype=np.uint8)
    with open_regular(path, SafetensorsError) as f:
        f.seek(data_start + begin)
        if f.readinto(memoryview(out)) != end - begin:
            raise SafetensorsError(f"{path}: ends within tensor {name!r}: the file changed while it was read")
    return out.view(dtype).reshape(entry["shape"])
