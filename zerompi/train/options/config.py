"""Training configuration: one dataclass whose fields carry their defaults, help and flags; the
command line built from it.

Each TrainConfig field is an `option(default, help, group, ...)`: build_parser turns it into
`--field-name` in its argument group, typed by its default (a bool becomes --x/--no-x, a tuple of
widths a comma-separated list), with any `choices` argparse then enforces itself.

The batch sizes are resolved in one place for flags, TOML and DeepSpeed files alike: batch_rule.py
(global batch = micro-batch x accumulation x N, any two deciding the third). The output paths are
checked against the inputs by output_paths.py, every value by config_checks.py. What is read
before MPI starts (--help, --version, --device, --collective-timeout) is read by before_mpi.py.

The defaults train the shipped handwritten digits with `mpirun -n 8 python -m zerompi.train` in well
under a minute on 2 cores.
"""
import argparse
import textwrap
from dataclasses import dataclass, field, fields

import numpy as np

from .batch_rule import DEFAULT_MICRO_BATCH, resolve_batch
from .config_checks import check_config
from .config_files import CommandLine, ConfigFileError, flags_from_file
from .environment import ENVIRONMENT
from .errors import ArgumentError
from .version import version_text
from .device_choice import DEVICE_CHOICES
from ...util.exit_codes import EXIT_MEANINGS, ExitCode
from ...precision import DTYPE_NAMES, precision_for
from ..loop.schedule import SCHEDULES
from ..loop.loss_scale import loss_scale_error


COMM_CHOICES = ("mpi", "nccl")
OFFLOAD_CHOICES = ("none", "host", "file")
REPORT_CHOICES = ("table", "json", "none")
PROGRESS_CHOICES = ("auto", "live", "lines")
DTYPE_SHOWN = ("float32", "float64", "bf16", "fp16")             # --help's choices; the other names: aliases

# The argument groups; --help lists them in the order of TrainConfig's fields. The config files
# come first (a file sets flags of every group); the collective guards are communication.
CONFIG_FILES, MODEL, DATA, OPTIMIZER, PRECISION, ZERO, CHECKPOINTS, OUTPUT = (
    "config files", "model", "data and batches", "optimizer and schedule", "precision",
    "ZeRO and communication", "checkpoints", "output")


def option(default, help, group, **argparse_kwargs):
    """A TrainConfig field: its default, and its flag's help text, argument group and any further
    argparse.add_argument keywords (choices, metavar, nargs, const; type where the default is None,
    which means: not given, resolved from the other flags)."""
    return field(default=default, metadata={"help": help, "group": group, "argparse": argparse_kwargs})


@dataclass
class TrainConfig:
    config: str = option("", "read flags from a TOML file (keys: the long flag names) or, if it ends in .json, "
                         "a DeepSpeed config; flags on the command line win", CONFIG_FILES, metavar="FILE")
    deepspeed_config: str = option("", "read a DeepSpeed JSON config (docs/command-line.md lists the keys it "
                                   "maps, ignores and refuses); flags on the command line win", CONFIG_FILES,
                                   metavar="FILE")
    hidden: tuple = option((128, 128), "hidden layer widths, comma-separated; the input and output "
                           "widths come from the data", MODEL, metavar="W1,W2,...")
    classes: int = option(0, "output width (0: 1 + the largest label in the data)", MODEL)
    seed: int = option(0, "initial weights and batch order", MODEL)
    data: str = option("digits", "digits (shipped), synthetic (generated), or an .npz with x (samples, "
                       "features) float and y (samples,) integer labels, optionally x_test, y_test", DATA,
                       metavar="NAME_OR_NPZ")
    shuffle: bool = option(True, "shuffle the training rows each epoch (by --seed); --no-shuffle: file order",
                           DATA)
    batch_size: int = option(None, "GLOBAL batch: rows per optimizer step over all N ranks (DeepSpeed's "
                             "train_batch_size) = micro-batch-size x grad-accum x N; any two of the three "
                             "decide the third. Not given: micro-batch-size x grad-accum x N", DATA,
                             type=int, metavar="ROWS")
    micro_batch_size: int = option(None, "rows per rank in each micro-batch (DeepSpeed's "
                                   f"train_micro_batch_size_per_gpu). Not given: from the other two, or "
                                   f"{DEFAULT_MICRO_BATCH} when --batch-size is not given either (so any N "
                                   f"runs)", DATA, type=int, metavar="ROWS")
    grad_accum: int = option(None, "micro-batches per optimizer step (gradient accumulation, DeepSpeed's "
                             "gradient_accumulation_steps). Not given: from the other two, or 1", DATA,
                             type=int, metavar="M")
    steps: int = option(300, "optimizer steps", OPTIMIZER)
    lr: float = option(3e-3, "peak AdamW learning rate", OPTIMIZER)
    lr_schedule: str = option("cosine", "constant, or cosine decay to --min-lr after the warm-up", OPTIMIZER,
                              choices=SCHEDULES)
    warmup_steps: int = option(20, "linear warm-up steps", OPTIMIZER, metavar="STEPS")
    min_lr: float = option(0.0, "learning rate at the end of the cosine", OPTIMIZER)
    weight_decay: float = option(0.01, "AdamW decoupled weight decay", OPTIMIZER)
    beta1: float = option(0.9, "AdamW first-moment decay", OPTIMIZER)
    beta2: float = option(0.999, "AdamW second-moment decay", OPTIMIZER)
    eps: float = option(1e-8, "AdamW denominator epsilon", OPTIMIZER)
    clip_norm: float = option(0.0, "clip the global gradient norm to this (0: off)", OPTIMIZER)
    fused_adam: bool = option(False, "the CPU's AdamW in one loop compiled by Numba (pip install -e "
                              "'.[fast]'), bit for bit the NumPy update's, near memory bandwidth "
                              "(docs/overlap-and-performance.md)", OPTIMIZER)
    dtype: str = option("float32", "parameters and gradients; bf16/fp16 keep an fp32 master copy and Adam "
                        f"state (also spelt {', '.join(name for name in DTYPE_NAMES if name not in DTYPE_SHOWN)})",
                        PRECISION, choices=tuple(DTYPE_NAMES), metavar="{" + ",".join(DTYPE_SHOWN) + "}")
    loss_scale: float = option(2.0 ** 16, "fp16: initial dynamic loss scale", PRECISION)
    loss_scale_window: int = option(200, "fp16: good steps before the loss scale doubles", PRECISION,
                                    metavar="STEPS")
    min_loss_scale: float = option(1.0, "fp16: stop with an error when the loss scale falls below this",
                                   PRECISION)
    stage: int = option(3, "ZeRO stage: 0 none (plain data parallel), 1 optimizer state, 2 + gradients, "
                        "3 + parameters partitioned", ZERO, choices=(0, 1, 2, 3))
    device: str = option("auto", "where the arrays live: cpu (NumPy), gpu (CuPy, one GPU per rank from the "
                         "local rank), auto (the GPU when CuPy sees one)", ZERO, choices=DEVICE_CHOICES)
    comm: str = option("mpi", "collectives through MPI (CUDA-aware or staged through pinned host memory), or "
                       "NCCL (GPU only; MPI still starts the job)", ZERO, choices=COMM_CHOICES)
    overlap: bool = option(False, "run the collectives on a communication thread while backward and forward "
                           "compute (the results are bitwise the same either way; off by default: measured "
                           "slower with one rank per core, docs/overlap-and-performance.md)", ZERO)
    bucket_mb: float = option(4.0, "stages 0-1: start reducing gradients a bucket of consecutive layers of at "
                              "least this many MB at a time (0: every layer)", ZERO, metavar="MB")
    prefetch: int = option(1, "stage 3 with --overlap: all-gather this many layers ahead (one layer buffer "
                           "each)", ZERO, metavar="LAYERS")
    keep_last_layer: bool = option(False, "stage 3: keep the last layer gathered from the end of forward to the "
                                   "start of backward, one all-gather fewer per micro-batch, as FSDP2 keeps its "
                                   "root module (the weights are the same bit for bit)", ZERO)
    shard_group: str = option("world", "hybrid sharding: ZeRO inside groups of S consecutive ranks (node: the "
                              "ranks of one node), replicas across the groups; stages 1-3 "
                              "(docs/multi-node.md)", ZERO, metavar="{world,node,S}")
    hpz: bool = option(False, "stage 3: a second copy of the parameters sharded inside each node, so that "
                       "backward's all-gathers stay in the node (ZeRO++'s hpZ, docs/multi-node.md)", ZERO)
    offload_optimizer: str = option("none", "where each rank's optimizer state (fp32 master, m, v) lives: none "
                                    "(the device's memory), host (ZeRO-Offload: pinned host memory, AdamW "
                                    "on the CPU; on a CPU run the host is the device), file (ZeRO-Infinity: "
                                    "a scratch file per rank in --offload-dir, read and written in tiles; "
                                    "docs/offload.md)", ZERO, choices=OFFLOAD_CHOICES)
    offload_params: str = option("none", "stage 3: where each rank's parameter shard lives: none, host or file "
                                 "(read a layer ahead of its all-gathers; needs --offload-optimizer host or "
                                 "file, where the update runs)", ZERO, choices=OFFLOAD_CHOICES)
    quantize_weights: str = option("none", "stage 3: all-gather the parameters as int8 blocks, a float32 scale "
                                   "each (ZeRO++'s qwZ; the shards, the master and Adam stay exact; "
                                   "docs/quantization.md)", ZERO, choices=("none", "int8"))
    quantize_grads: str = option("none", "stages 2-3: reduce the gradients through an all-to-all of int8 blocks "
                                 "(int4: packed two to a byte), each owner summing them in full precision "
                                 "(ZeRO++'s qgZ; docs/quantization.md)", ZERO, choices=("none", "int8", "int4"))
    quant_block: int = option(2048, "elements per scale of --quantize-weights and --quantize-grads", ZERO,
                              metavar="ELEMENTS")
    quant_error: bool = option(False, "each step, the relative L2 error of the quantized gathers and reductions "
                               "against exact ones run beside them (in --metrics, TensorBoard, the report; "
                               "costs an exact call per quantized one)", ZERO)
    offload_dir: str = option("", "the folder of the file tier's scratch files (one or two per rank, removed "
                              "however the run ends); may be node-local", ZERO, metavar="DIR")
    check_collectives: bool = option(False, "before each collective, check that every rank calls the same "
                                     "one (kind, size, dtype, call site); stop naming both sides if not",
                                     ZERO)
    collective_timeout: float = option(600.0, "end the job when a collective waits longer than this for the "
                                       "other ranks (0: never)", ZERO, metavar="SECONDS")
    in_process_ranks: int = option(0, "run N ranks as threads of this one process, without MPI or mpirun "
                                   "(docs/in-process.md; 0: the MPI job's ranks)", ZERO, metavar="N")
    in_process_nodes: int = option(1, "with --in-process-ranks: M emulated nodes, the ranks in blocks (for "
                                   "--shard-group node, --hpz, qgZ's two hops)", ZERO, metavar="M")
    init_weights: str = option("", "start from this consolidated .npz instead of a random init", CHECKPOINTS,
                               metavar="FILE")
    save_weights: str = option("", "save the final weights to this .npz (one consolidated file)", CHECKPOINTS,
                               metavar="FILE")
    save_dir: str = option("", "write sharded checkpoints here (at the end, every --save-every steps, and "
                           "on SIGTERM/SIGUSR1; see zerompi/checkpoint)", CHECKPOINTS, metavar="FOLDER")
    save_every: int = option(0, "checkpoint every this many steps (0: only at the end)", CHECKPOINTS,
                             metavar="STEPS")
    keep_last: int = option(3, "newest checkpoints to keep (0: all)", CHECKPOINTS, metavar="K")
    resume: str = option("", "--resume: continue from --save-dir's newest checkpoint (start fresh if there "
                         "is none); --resume FOLDER: from that checkpoint, written with any N and stage",
                         CHECKPOINTS, nargs="?", const="latest", metavar="FOLDER")
    log_every: int = option(25, "steps between progress lines (0: none)", OUTPUT, metavar="STEPS")
    report: str = option("table", "end-of-run ledger; json: stdout holds only the JSON report, progress goes "
                         "to stderr", OUTPUT, choices=REPORT_CHOICES)
    progress: str = option("auto", "live: a live step/loss/steps-per-second/ETA line on rank 0; lines: the "
                           "log lines only; auto: live only where the output really is a terminal, mpirun's "
                           "own included (not in files or Slurm jobs; docs/observability.md)", OUTPUT,
                           choices=PROGRESS_CHOICES)
    metrics: str = option("", "write one JSON object per step to this .jsonl file (zerompi/train/outputs/metrics.py)",
                          OUTPUT, metavar="FILE")
    tensorboard: str = option("", "write the per-step metrics as TensorBoard scalars into this folder (needs "
                              "the tensorboard extra; zerompi/train/outputs/tensorboard.py)", OUTPUT, metavar="DIR")
    trace: str = option("", "write every rank's compute and communication spans to this Chrome trace .json "
                        "file (open it in https://ui.perfetto.dev)", OUTPUT, metavar="FILE")

    @property
    def precision(self):
        """--dtype resolved: zerompi/precision.py's Precision, what the reference is handed (the
        name itself, one canonical spelling after parse_args, is for the lines a run prints)."""
        return precision_for(self.dtype)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so that under MPI the error is
    printed once, by one rank, and every rank exits together."""

    def __init__(self, rank, **kwargs):
        super().__init__(**kwargs)
        self.rank = rank

    def error(self, message):
        raise ArgumentError(message)

    def print_help(self, file=None):
        if self.rank == 0:            # --help prints once, not once per rank
            super().print_help(file)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows "(default: ...)" after each flag's help where there is one to show (not for a flag
    whose default is empty or None: its help says what happens when it is not given); a switch's
    default as the switch (--no-overlap). The epilog keeps its lines."""

    def _get_help_string(self, action):
        if action.default in ("", None, argparse.SUPPRESS):
            return action.help
        if isinstance(action, argparse.BooleanOptionalAction):
            on, off = action.option_strings
            return f"{action.help} (default: {on if action.default else off})"
        return super()._get_help_string(action)

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)   # --no-overlap whole


class _Version(argparse.Action):
    """--version: zerompi's version and those of Python, NumPy, mpi4py and the MPI library
    (zerompi/train/options/version.py), printed once; exit 0."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if parser.rank == 0:
            print(version_text(), flush=True)
        parser.exit()


def _positive_ints(text):
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"widths must be positive integers, got {text!r}")
    return values


def _flag(f):
    """add_argument's keywords for TrainConfig field f: typed by its default (by its `type` where
    the default is None: not given)."""
    kwargs = dict(help=f.metadata["help"], **f.metadata["argparse"])
    if isinstance(f.default, bool):
        return dict(kwargs, action=argparse.BooleanOptionalAction, default=f.default)
    if isinstance(f.default, tuple):
        return dict(kwargs, type=_positive_ints, default=",".join(map(str, f.default)))
    if f.default is None:
        return dict(kwargs, default=None)
    return dict(kwargs, type=type(f.default), default=f.default)


def _epilog():
    """The exit statuses and the environment variables zerompi reads, as --help ends."""
    width = max(len(str(code.value)) for code in ExitCode)
    lines = ["exit status (zerompi/util/exit_codes.py):"]
    lines += [f"  {code.value:>{width}}  {code.name.lower().replace('_', ' ')}: {EXIT_MEANINGS[code]}"
              for code in ExitCode]
    lines += ["", "environment variables read (none is needed):"]
    for names, meaning in ENVIRONMENT:
        lines += textwrap.wrap(", ".join(names), 78, initial_indent="  ", subsequent_indent="  ")
        lines.append(f"      {meaning}")
    return "\n".join(lines)


PLANNING_VALUE_FLAGS = ("--ranks", "--ranks-per-node")


def add_planning_flags(parser):
    """--dry-run and its two numbers, for build_parser (zerompi/train/options/config.py)."""
    group = parser.add_argument_group("planning (docs/planning.md)")
    group.add_argument("--dry-run", action="store_true", default=None, help="print the plan of the run (each rank's bytes "
                       "by kind and one step's collectives, every stage side by side) and exit, without MPI")
    group.add_argument("--ranks", type=int, metavar="N", help="--dry-run: plan for N ranks (default: the "
                       "launcher's)")
    group.add_argument("--ranks-per-node", type=int, metavar="L", help="--dry-run: L ranks on each node, in "
                       "blocks (default: the launcher's, else all on one node)")


def build_parser(rank=0):
    p = _Parser(rank, prog="python -m zerompi.train", usage="mpirun -n N %(prog)s [options]",
                description="Train an MLP data-parallel over MPI ranks with ZeRO stage 0-3.",
                epilog=_epilog(), formatter_class=_HelpFormatter)
    p.add_argument("--version", action=_Version, help="print the versions of zerompi, Python, NumPy, mpi4py "
                   "and the MPI library, and exit")
    groups = {}
    for f in fields(TrainConfig):
        group = f.metadata["group"]
        if group not in groups:
            groups[group] = p.add_argument_group(group)
        groups[group].add_argument(f"--{f.name.replace('_', '-')}", **_flag(f))
    add_planning_flags(p)
    return p


def _file_keys():
    """{long flag name: the type of its value (bool for a --x/--no-x switch, int, float, str, tuple
    for a list of widths)}: the keys a TOML config file may hold."""
    return {f.name.replace("_", "-"): f.metadata["argparse"].get("type", type(f.default))
            for f in fields(TrainConfig)}


def _takes_one_value(f):
    """Whether TrainConfig field f's flag takes exactly one value (not a switch, not --resume's
    optional one)."""
    return not isinstance(f.default, bool) and f.metadata["argparse"].get("nargs") is None


def values_joined(argv):
    """argv with each value that begins with "-" joined to the flag before it, ["--lr", "-1e-3"] ->
    ["--lr=-1e-3"] (argparse takes -1e-3, or a file named -x.npz, for a flag and reports "expected
    one argument"), where that flag takes one value and the token after it names no flag."""
    takes_value = {_flag_name(f) for f in fields(TrainConfig) if _takes_one_value(f)} | set(PLANNING_VALUE_FLAGS)
    flags = {_flag_name(f) for f in fields(TrainConfig)} | {f"--no-{f.name.replace('_', '-')}" for f in
                                                            fields(TrainConfig)} | {"--help", "--version", "--dry-run"}
    flags |= set(PLANNING_VALUE_FLAGS)

    def names_a_flag(token):                 # a flag, or its abbreviation (argparse's allow_abbrev)
        stem = token.split("=", 1)[0]
        return token == "-h" or (stem.startswith("--") and any(flag.startswith(stem) for flag in flags))
    joined, i = [], 0
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) else None
        if argv[i] in takes_value and value is not None and value.startswith("-") and not names_a_flag(value):
            joined.append(f"{argv[i]}={value}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined


def _flag_name(f):
    return f"--{f.name.replace('_', '-')}"


def parse_args(argv, rank=0, num_ranks=1):
    """TrainConfig from a command line and the config file it names (zerompi/train/options/config_files.py),
    its batch sizes resolved for N = num_ranks (resolve_batch); raises ArgumentError with a
    one-line message. A value from the file that check_config refuses is named by the file's key."""
    argv = values_joined(argv)
    parser = build_parser(rank)
    files = _Parser(rank, add_help=False)
    files.add_argument("--config", default="")
    files.add_argument("--deepspeed-config", default="")
    files.add_argument("--dtype")                     # what a DeepSpeed file's "auto" and fp16 follow
    files.add_argument("--lr", type=float)
    path = files.parse_known_args(argv)[0]
    if path.config and path.deepspeed_config:
        raise ArgumentError("--config and --deepspeed-config: choose one")
    name, keys = path.config or path.deepspeed_config, {}
    if name:
        try:
            file_flags, keys = flags_from_file(name, bool(path.deepspeed_config) or name.endswith(".json"),
                                               _file_keys(), CommandLine(path.dtype, path.lr, TrainConfig.dtype,
                                                                         TrainConfig.lr))
            from_file = build_parser(rank).parse_args(file_flags)
        except ConfigFileError as e:
            raise ArgumentError(str(e)) from None
        except ArgumentError as e:
            raise ArgumentError(f"{name}: {e}") from None
        parser.set_defaults(**{f.name: getattr(from_file, f.name) for f in fields(TrainConfig)})
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    cfg.dtype = next(shown for shown in DTYPE_SHOWN if DTYPE_NAMES[shown] == DTYPE_NAMES[cfg.dtype])   # one name
    cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum = resolve_batch(
        cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum, num_ranks)
    error = (check_config(cfg, num_ranks) or loss_scale_error(cfg.precision.storage == np.float16, cfg.loss_scale,
                                                             cfg.min_loss_scale)) if keys else None
    flag = error and error.split()[0]
    if flag in keys and flag not in _given(argv):        # the file's value, not the command line's
        raise ArgumentError(f"{name}: {keys[flag]}: {error}")
    return cfg


def _given(argv):
    """The flags ("--name") whose value argv itself gives, as argparse reads them: a whole name, an
    abbreviation of one name, a --no-name switch."""
    names = {_flag_name(f): _flag_name(f) for f in fields(TrainConfig)}
    names.update({f"--no-{f.name.replace('_', '-')}": _flag_name(f) for f in fields(TrainConfig)
                  if isinstance(f.default, bool)})
    given = set()
    for token in argv:
        stem = token.split("=", 1)[0]
        matches = [flag for written, flag in names.items() if written == stem] or \
                  [flag for written, flag in names.items() if written.startswith(stem) and stem.startswith("--")]
        if len(set(matches)) == 1:
            given.add(matches[0])
    return given
