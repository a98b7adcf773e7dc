"""safetensors, written and read one tensor at a time (the format PyTorch, JAX and NumPy users load).

The format (https://github.com/huggingface/safetensors):

    | 8 bytes: header length H, little-endian u64 | H bytes: JSON header | tensor data ... |
    header: {"name": {"dtype": "F32", "shape": [O, I], "data_offsets": [begin, end]}, ...,
             "__metadata__": {"key": "value", ...}}
    offsets are relative to the start of the data; tensors are C-ordered, little-endian.

The header is computed first from the names, shapes and dtypes, so the data can then be streamed:
no more than one tensor is ever in memory. The file is written atomically (zerompi/checkpoint/atomic.py). bfloat16 is stored as "BF16" (its raw 16-bit words), which PyTorch and
JAX read natively; this reader returns it as ml_dtypes.bfloat16.
"""
import json
import os
import struct

import ml_dtypes
import numpy as np

from .atomic import atomic_file

DTYPE_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
               np.dtype(ml_dtypes.bfloat16): "BF16"}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


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
    """(header dict without __metadata__, metadata, data start) of a safetensors file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            length = struct.unpack("<Q", f.read(8))[0]
            if length > size - 8:
                raise SafetensorsError(f"{path}: header length {length} exceeds the file ({size} bytes)")
            header = json.loads(f.read(length))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    data_start, data_bytes = 8 + length, size - 8 - length
    for name, entry in header.items():
        try:
            dtype = CODE_DTYPES[entry["dtype"]]
            begin, end = entry["data_offsets"]
            expected = int(np.prod(entry["shape"])) * dtype.itemsize
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name!r} has an unsupported or malformed entry {entry}") from None
        if end - begin != expected or not 0 <= begin <= end <= data_bytes:
            raise SafetensorsError(f"{path}: tensor {name!r} has data offsets {entry['data_offsets']} that do "
                                   f"not fit its shape {entry['shape']} and the {data_bytes} data bytes")
    return header, metadata, data_start


def read_tensor(path, header, data_start, name):
    """One tensor, read from disk (a copy; the file is not kept open)."""
    entry = header[name]
    dtype = CODE_DTYPES[entry["dtype"]]
    begin, end = entry["data_offsets"]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start + begin, shape=(end - begin,))
    return np.array(raw).view(dtype).reshape(entry["shape"])
