"""What the training command line says before MPI starts: --help and --version answered at once
(so that they work where MPI cannot start), and the two choices MPI's start itself depends on.

    answer_without_mpi   --help, --version: printed by the launcher's rank 0, exit 0
    choices_before_mpi   --device (the GPU is chosen before MPI_Init: zerompi/train/options/device_choice.py),
                         --collective-timeout (the watchdog guards the first collective) and
                         --in-process-ranks (no MPI at all: zerompi/train/loop/in_process.py)

Both read the same flags and --config file as the full parse (zerompi/train/options/config.py), which
later reports whatever does not parse.
"""
import argparse
import math

from .config import TrainConfig, _Parser, _file_keys, build_parser, values_joined
from .config_files import ConfigFileError, flags_from_file
from .errors import ArgumentError
from .version import version_text
from ...util.exit_codes import ExitCode
from ...mpi import launcher_rank


def answer_without_mpi(argv, environ):
    """--help or --version (exactly those, as argparse would also read them in the full parse):
    printed by the launcher's rank 0 only, then exit 0; called before anything imports mpi4py.MPI,
    so that they work where MPI cannot start. Any other command line: returns."""
    peek = _Parser(rank=None, add_help=False, allow_abbrev=False)
    peek.add_argument("-h", "--help", action="store_true")
    peek.add_argument("--version", action="store_true")
    try:
        args = peek.parse_known_args(argv)[0]
    except ArgumentError:                      # e.g. --help=x: the full parse reports it
        return
    if not (args.help or args.version):
        return
    rank = launcher_rank(environ)
    if args.help:
        build_parser(rank).print_help()
    elif rank == 0:
        print(version_text(), flush=True)
    raise SystemExit(ExitCode.OK)


def choices_before_mpi(argv):
    """--device and --collective-timeout from the command line, or from the TOML file --config
    names, read before MPI starts: the GPU is chosen before MPI_Init (zerompi/train/options/device_choice.py says
    why), and the watchdog guards the collectives from the first one. A value that does not parse,
    or a file that does not read, counts as the default: the full parse reports it later."""
    peek = _Parser(rank=None, add_help=False)
    peek.add_argument("--device")
    peek.add_argument("--collective-timeout", type=float)
    peek.add_argument("--in-process-ranks", type=int)
    peek.add_argument("--in-process-nodes", type=int)
    peek.add_argument("--config", default="")
    empty = argparse.Namespace(device=None, collective_timeout=None, config="", in_process_ranks=None,
                               in_process_nodes=None)
    try:
        args = peek.parse_known_args(values_joined(argv))[0]
    except ArgumentError:
        args = empty
    if args.config and not args.config.endswith(".json"):
        try:
            toml = peek.parse_known_args(flags_from_file(args.config, False, _file_keys(), None)[0])[0]
        except (ArgumentError, ConfigFileError):
            toml = empty
        args.device = args.device or toml.device
        args.collective_timeout = args.collective_timeout if args.collective_timeout is not None \
            else toml.collective_timeout
        for name in ("in_process_ranks", "in_process_nodes"):        # the command line's, if it gives one
            setattr(args, name, getattr(args, name) if getattr(args, name) is not None else getattr(toml, name))
    timeout = args.collective_timeout
    valid = timeout is not None and math.isfinite(timeout) and timeout >= 0
    return argparse.Namespace(device=args.device or TrainConfig.device,
                              collective_timeout=timeout if valid else TrainConfig.collective_timeout,
                              in_process_ranks=max(args.in_process_ranks or 0, 0),   # < 0: config_checks.py's
                              in_process_nodes=args.in_process_nodes or 1)
