"""`python -m zerompi.checkpoint`: inspect, consolidate and convert sharded checkpoints.

    python -m zerompi.checkpoint inspect CKPT                 manifest summary; every checksum verified
    python -m zerompi.checkpoint consolidate CKPT OUT.npz     the model as one consolidated .npz
    python -m zerompi.checkpoint export CKPT OUT.safetensors [--optimizer] [--dtype float32]

CKPT is a checkpoint folder (one holding a manifest.json) or a --save-dir (the checkpoint
--resume would continue from: zerompi/checkpoint/find.py; a line says so when
that is not the one `latest` names). Everything streams one tensor at a time; errors print one
line naming the file (the output's name for what cannot be written) and exit with status 2.
The output's suffix is the command's format (.npz for consolidate, .safetensors for export):
--init-weights reads a file by its suffix, so another one is refused before anything is written.
"""
import argparse
import os
import sys
from typing import NamedTuple

from ...util.inputs import printable
from ...checkpoint.export import consolidate, export_safetensors, verify_all
from ...checkpoint.files import MANIFEST, CheckpointError, replaces_checkpoint_file
from ...checkpoint.manifest import read_manifest, unverified_note
from ...checkpoint.find import find_checkpoint
from ...checkpoint.safetensors_io import SafetensorsError


def resolve(path):
    """(a checkpoint folder: path itself, or the one found in the save dir path; a note or None)."""
    if os.path.lexists(os.path.join(path, MANIFEST)):
        return path, None
    folder, note = find_checkpoint(path)
    if folder is None:
        raise CheckpointError(f"{path}: neither a checkpoint folder (no {MANIFEST}) nor a save directory "
                              f"holding one")
    return folder, note


def inspect(folder, args):
    m = read_manifest(folder)
    files, blocks, total = verify_all(folder)
    print(printable(f"{folder}: step {m['step']} (Adam step {m['adam_steps']}), ZeRO stage {m['stage']}, "
                    f"{m['ranks']} ranks, {m['dtype']}, MLP {'-'.join(map(str, m['sizes']))}"))
    print(f"  state kinds: {', '.join(f'{k} ({d})' for k, d in m['kinds'].items())}")
    print(f"  data order: seed {m['seed']}, shuffle {m['shuffle']}, global batch {m['batch_size']}; "
          f"loss scale {m['loss_scale']:g}")
    for layer in m["units"]:
        print(f"  {', '.join(layer['names'])}: {layer['numel']:,} elements, padded to {layer['padded']:,} "
              f"= {m['ranks']} x {layer['shard_size']:,}")
    print(f"  {files} shard files, {total:,} bytes: all {blocks} blocks match their CRC-32")
    print(printable(f"  {unverified_note(folder, m) or 'manifest: version 2, its SHA-256 matches'}"))


def write_consolidated(folder, args):
    count = writing(args.output, consolidate, folder, args.output)
    print(printable(f"wrote {args.output}: {count} tensors from {folder}"))


def write_safetensors(folder, args):
    as_float32 = args.dtype == "float32"
    count = writing(args.output, export_safetensors, folder, args.output, args.optimizer, as_float32)
    print(printable(f"wrote {args.output}: {count} tensors{' (float32)' if as_float32 else ''} from {folder}"))


class Format(NamedTuple):
    command: str             # the command that writes it
    suffix: str
    name: str


NPZ = Format("consolidate", ".npz", "a consolidated .npz")
SAFETENSORS = Format("export", ".safetensors", "safetensors")


def suffix_problem(output, writes, other):
    """One line when the output's name does not end in the suffix of the format written, else None."""
    if output.endswith(writes.suffix):
        return None
    return (f"{output}: {writes.command} writes {writes.name}, so the output's name must end in {writes.suffix} "
            f"(for {other.name}: python -m zerompi.checkpoint {other.command} CKPT OUT{other.suffix})")


def writing(output, write, *write_args):
    """write(*write_args), with an error writing the output (a temporary file, renamed into
    place) named as the output."""
    try:
        return write(*write_args)
    except OSError as e:
        raise CheckpointError(f"{output}: cannot be written: {e.strerror or e}") from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m zerompi.checkpoint",
                                     description="Inspect, consolidate and convert zerompi checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("inspect", help="print the manifest and verify every checksum")
    p.add_argument("checkpoint", help="a checkpoint folder, or a --save-dir (its latest)")
    p.set_defaults(run=inspect)
    p = commands.add_parser("consolidate", help="write the model as one consolidated .npz")
    p.add_argument("checkpoint")
    p.add_argument("output", help="the .npz to write")
    p.set_defaults(run=write_consolidated, writes=NPZ, other=SAFETENSORS)
    p = commands.add_parser(
        "export", help="write the model (and optionally Adam's state) as safetensors",
        description="Write the model (and optionally Adam's state) as safetensors, one tensor at a time. A bf16 "
                    "model's tensors stay bfloat16 (BF16): PyTorch and JAX read them as they are, but "
                    "safetensors.numpy.load_file only after `import ml_dtypes` (NumPy has no bfloat16 of its own); "
                    "--dtype float32 writes float32, which every reader loads.")
    p.add_argument("checkpoint")
    p.add_argument("output", help="the .safetensors to write")
    p.add_argument("--optimizer", action="store_true", help="also the fp32 master, m and v")
    p.add_argument("--dtype", choices=("stored", "float32"), default="stored",
                   help="stored: each tensor in its checkpoint dtype (default); float32: every tensor as float32 "
                        "(bf16 and fp16 widened exactly, float64 rounded)")
    p.set_defaults(run=write_safetensors, writes=SAFETENSORS, other=NPZ)
    args = parser.parse_args(argv)
    try:
        folder, note = resolve(args.checkpoint)
        if note:
            print(printable(note))
        if args.command != "inspect":
            problem = replaces_checkpoint_file(args.output, os.path.dirname(os.path.abspath(folder)), folder)
            if problem:
                raise CheckpointError(f"{problem}: write it elsewhere")
            problem = suffix_problem(args.output, args.writes, args.other)
            if problem:
                raise CheckpointError(problem)
        args.run(folder, args)
    except (CheckpointError, SafetensorsError, KeyError, TypeError, ValueError) as e:
        print(f"zerompi.checkpoint: error: {printable(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        print(printable(f"zerompi.checkpoint: error: {getattr(e, 'filename', '') or ''}: {e.strerror or e}"),
              file=sys.stderr)
        return 2
    return 0

