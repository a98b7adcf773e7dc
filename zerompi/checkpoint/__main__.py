"""`python -m zerompi.checkpoint`: inspect, consolidate and convert sharded checkpoints.

    python -m zerompi.checkpoint inspect CKPT                 manifest summary; every checksum verified
    python -m zerompi.checkpoint consolidate CKPT OUT.npz     the model as one consolidated .npz
    python -m zerompi.checkpoint export CKPT OUT.safetensors [--optimizer]

CKPT is a checkpoint folder (step_XXXXXXXX) or a --save-dir (its `latest` is used). Everything
streams one tensor at a time; errors print one line and exit with status 2.
"""
import argparse
import os
import sys

from .export import consolidate, export_safetensors, verify_all
from .files import LATEST, CheckpointError, latest_checkpoint, read_manifest
from .safetensors_io import SafetensorsError


def resolve(path):
    """A checkpoint folder: path itself, or the one path/latest names."""
    if os.path.isfile(os.path.join(path, LATEST)):
        return latest_checkpoint(path)
    return path


def inspect(folder):
    m = read_manifest(folder)
    files, blocks, total = verify_all(folder)
    print(f"{folder}: step {m['step']} (Adam step {m['adam_steps']}), ZeRO stage {m['stage']}, "
          f"{m['ranks']} ranks, {m['dtype']}, MLP {'-'.join(map(str, m['sizes']))}")
    print(f"  state kinds: {', '.join(f'{k} ({d})' for k, d in m['kinds'].items())}")
    print(f"  data order: seed {m['seed']}, shuffle {m['shuffle']}, global batch {m['batch_size']}; "
          f"loss scale {m['loss_scale']:g}")
    for layer in m["units"]:
        print(f"  {', '.join(layer['names'])}: {layer['numel']:,} elements, padded to {layer['padded']:,} "
              f"= {m['ranks']} x {layer['shard_size']:,}")
    print(f"  {files} shard files, {total:,} bytes: all {blocks} blocks match their CRC-32")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m zerompi.checkpoint",
                                     description="Inspect, consolidate and convert zerompi checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("inspect", help="print the manifest and verify every checksum")
    p.add_argument("checkpoint", help="a checkpoint folder, or a --save-dir (its latest)")
    p = commands.add_parser("consolidate", help="write the model as one consolidated .npz")
    p.add_argument("checkpoint")
    p.add_argument("output", help="the .npz to write")
    p = commands.add_parser("export", help="write the model (and optionally Adam's state) as safetensors")
    p.add_argument("checkpoint")
    p.add_argument("output", help="the .safetensors to write")
    p.add_argument("--optimizer", action="store_true", help="also the fp32 master, m and v")
    args = parser.parse_args(argv)
    try:
        folder = resolve(args.checkpoint)
        if args.command == "inspect":
            inspect(folder)
        elif args.command == "consolidate":
            count = consolidate(folder, args.output)
            print(f"wrote {args.output}: {count} tensors from {folder}")
        else:
            count = export_safetensors(folder, args.output, args.optimizer)
            print(f"wrote {args.output}: {count} tensors from {folder}")
    except (CheckpointError, SafetensorsError, KeyError, TypeError, ValueError) as e:
        print(f"zerompi.checkpoint: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"zerompi.checkpoint: error: {getattr(e, 'filename', '') or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
