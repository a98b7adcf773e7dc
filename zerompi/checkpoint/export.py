"""Streaming export of a checkpoint: the consolidated .npz and safetensors, one tensor at a time.

Every tensor is a contiguous range of its layer's flat buffer (weight: [0, O*I), bias: [O*I, numel)),
so it is read straight from the shard files of the ranks that owned it (CheckpointReader), written
out, and dropped before the next: memory stays at one tensor, whatever the model's size.

    model tensors       layers.{i}.weight (O, I), layers.{i}.bias (O,)     the stored parameters
    with optimizer:     optimizer.{master,m,v}.layers.{i}.{weight,bias}    fp32 master (mixed
                        precision only), Adam's m and v; metadata holds adam_steps, step and,
                        from a training run, its data and input_scale (feed x * input_scale)

Each tensor is written in its stored dtype (bf16 stays bfloat16), or with as_float32 in float32:
bf16 and fp16 widen exactly (every value is the same number), float64 rounds to the nearest.
"""
import numpy as np

from .safetensors_io import write_safetensors
from .weights import write_npz
from .reader import CheckpointReader


def tensor_ranges(manifest):
    """[(layer index, name, shape, lo, hi), ...] for every tensor of the model, in order."""
    out = []
    for index, layer in enumerate(manifest["units"]):
        lo = 0
        for name, shape in zip(layer["names"], layer["shapes"]):
            hi = lo + int(np.prod(shape))
            out.append((index, name, tuple(shape), lo, hi))
            lo = hi
    return out


def _tensors(reader, kinds_and_prefixes, as_float32=False):
    """[(name, shape, dtype as written)], and a generator of the arrays, as stored, in that order."""
    specs, sources = [], []
    for kind, prefix in kinds_and_prefixes:
        dtype = reader.kinds[kind]
        for index, name, shape, lo, hi in tensor_ranges(reader.manifest):
            specs.append((prefix + name, shape, np.dtype(np.float32) if as_float32 else dtype))
            sources.append((index, kind, lo, hi, dtype, shape))

    def generate():
        for index, kind, lo, hi, dtype, shape in sources:
            yield reader.read_range(index, kind, lo, hi, dtype).reshape(shape)
    return specs, generate()


def export_safetensors(folder, path, with_optimizer=False, as_float32=False):
    """Write the safetensors file (write_safetensors converts each tensor to its spec's dtype)."""
    reader = CheckpointReader(folder)
    parts = [("params", "")]
    if with_optimizer:
        parts += [(kind, f"optimizer.{kind}.") for kind in ("master", "m", "v") if kind in reader.kinds]
    specs, tensors = _tensors(reader, parts, as_float32)
    m = reader.manifest
    metadata = {"format": "zerompi", "step": m["step"], "adam_steps": m["adam_steps"], "dtype": m["dtype"],
                "sizes": ",".join(map(str, m["sizes"]))}
    run = m.get("run", {})
    metadata.update({key: str(run[key]) for key in ("data", "input_scale") if key in run})   # how to feed it
    write_safetensors(path, specs, tensors, metadata)
    return len(specs)


def consolidate(folder, path):
    """The model's parameters as one consolidated .npz (zerompi/checkpoint/weights.py's format)."""
    reader = CheckpointReader(folder)
    specs, tensors = _tensors(reader, [("params", "")])
    write_npz(path, ((name, tensor) for (name, _, _), tensor in zip(specs, tensors)))
    return len(specs)


def verify_all(folder):
    """Read every block of every shard file and check its CRC; returns (files, blocks, bytes)."""
    reader = CheckpointReader(folder)
    blocks = total = 0
    for (rank, kind), entry in sorted(reader.files.items()):
        numel = entry["data_bytes"] // reader._array(rank, kind).dtype.itemsize
        reader._verify(rank, kind, 0, numel)
        blocks += len(entry["crc32"])
        total += entry["data_bytes"]
    return len(reader.files), blocks, total
