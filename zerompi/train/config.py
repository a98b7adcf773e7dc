"""Training configuration: one dataclass with commented defaults, its command line, its checks.

The defaults train the shipped handwritten digits with `mpirun -n 8 python -m zerompi.train` in well
under a minute on 2 cores. Every check here runs identically on every rank (it depends only on the
arguments and N), so every rank reaches the same verdict without communicating.
"""
import argparse
import math
from dataclasses import dataclass, fields

from .config_files import ConfigFileError, flags_from_file
from ..devices.device import DEVICE_CHOICES
from ..precision import DTYPE_NAMES
from .schedule import SCHEDULES


COMM_CHOICES = ("mpi", "nccl")


@dataclass
class TrainConfig:
    stage: int = 3                  # ZeRO stage: 0 (plain data parallel), 1, 2 or 3
    hidden: tuple = (128, 128)      # hidden layer widths; input and output widths come from the data
    classes: int = 0                # output width; 0: 1 + the largest label in the data
    batch_size: int = 128           # GLOBAL batch: rows per optimizer step summed over all ranks
    grad_accum: int = 1             # micro-batches per step (each rank: batch_size / (N * grad_accum) rows)
    steps: int = 300                # optimizer steps
    lr: float = 3e-3                # peak AdamW learning rate
    lr_schedule: str = "cosine"     # constant, or cosine decay after the warm-up
    warmup_steps: int = 20          # linear warm-up steps
    min_lr: float = 0.0             # where the cosine ends
    weight_decay: float = 0.01      # AdamW decoupled weight decay
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 0.0          # clip the global gradient norm to this (0: no clipping)
    dtype: str = "float32"          # float32, float64, bf16 or fp16 (16-bit: fp32 master and Adam state)
    loss_scale: float = 2.0 ** 16   # fp16: initial dynamic loss scale
    loss_scale_window: int = 200    # fp16: good steps before the scale doubles
    min_loss_scale: float = 1.0     # fp16: stop with an error when the scale falls below this
    seed: int = 0                   # initial weights and the shuffling of batches
    data: str = "digits"            # digits (shipped), synthetic (generated), or an .npz path
    shuffle: bool = True            # shuffle the training rows every epoch (by seed), else in order
    init_weights: str = ""          # start from this consolidated .npz instead of a random init
    save_weights: str = ""          # write the final weights here as one consolidated .npz
    save_dir: str = ""              # sharded checkpoints go here (see zerompi/checkpoint)
    save_every: int = 0             # checkpoint every this many steps (0: only at the end)
    keep_last: int = 3              # keep this many newest checkpoints (0: all)
    resume: str = ""                # "latest": from --save-dir's newest checkpoint if any; or a folder
    log_every: int = 25             # print loss and accuracy every this many steps (0: never)
    report: str = "table"           # end-of-run ledger: table, json (only JSON on stdout) or none
    device: str = "auto"            # cpu (NumPy), gpu (CuPy), or auto: the GPU when CuPy sees one
    comm: str = "mpi"               # collectives through MPI, or nccl (GPU only, NCCL via CuPy)
    progress: str = "auto"          # live: a live line on rank 0; lines: log lines only; auto: live on a terminal
    metrics: str = ""               # write one JSON line per step here (zerompi/train/metrics.py)
    trace: str = ""                 # write a Chrome trace of every rank's spans here (zerompi/observe/trace.py)
    check_collectives: bool = False # exchange a header before each collective; stop on a disagreement
    collective_timeout: float = 600.0   # end the job when a collective waits longer (seconds; 0: never)
    overlap: str = "off"            # on: collectives run on a communication thread, overlapping compute
    #                                 (off by default: measured slower with one rank per core, README)
    bucket_mb: float = 4.0          # stages 0-1: gradients start reducing in buckets of >= this many MB
    prefetch: int = 1               # stage 3: layers whose all-gather starts ahead of their use


class ArgumentError(Exception):
    """A bad command line; str(e) is the one-line message."""


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


def _positive_ints(text):
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"widths must be positive integers, got {text!r}")
    return values


def build_parser(rank=0):
    d = TrainConfig()
    p = _Parser(rank, prog="python -m zerompi.train",
                description="Train an MLP data-parallel over MPI ranks with ZeRO stage 0-3 "
                            "(run it under mpirun -n N).",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--stage", type=int, default=d.stage, metavar="{0,1,2,3}", help="ZeRO stage: 0 none, 1 optimizer state, "
                   "2 + gradients, 3 + parameters partitioned")
    p.add_argument("--hidden", type=_positive_ints, default=",".join(map(str, d.hidden)),
                   help="hidden widths, comma-separated")
    p.add_argument("--classes", type=int, default=d.classes, help="output width (0: from the labels)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="global batch per optimizer step (divisible by N * grad-accum)")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum,
                   help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    p.add_argument("--lr-schedule", default=d.lr_schedule, metavar="{" + ",".join(SCHEDULES) + "}",
                   help="constant, or cosine decay to --min-lr after the warm-up")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear warm-up steps")
    p.add_argument("--min-lr", type=float, default=d.min_lr, help="learning rate at the end of the cosine")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW decoupled weight decay")
    p.add_argument("--beta1", type=float, default=d.beta1, help="AdamW first-moment decay")
    p.add_argument("--beta2", type=float, default=d.beta2, help="AdamW second-moment decay")
    p.add_argument("--eps", type=float, default=d.eps, help="AdamW denominator epsilon")
    p.add_argument("--clip-norm", type=float, default=d.clip_norm,
                   help="clip the global gradient norm to this (0: off)")
    p.add_argument("--seed", type=int, default=d.seed, help="initial weights and batch order")
    p.add_argument("--dtype", default=d.dtype, metavar="{float32,float64,bf16,fp16}",
                   help="parameters and gradients; bf16/fp16 keep an fp32 master copy and Adam state")
    p.add_argument("--loss-scale", type=float, default=d.loss_scale, help="fp16: initial loss scale")
    p.add_argument("--loss-scale-window", type=int, default=d.loss_scale_window,
                   help="fp16: good steps before the loss scale doubles")
    p.add_argument("--min-loss-scale", type=float, default=d.min_loss_scale,
                   help="fp16: stop with an error when the loss scale falls below this")
    p.add_argument("--data", default=d.data, help="digits (shipped), synthetic (generated), or an .npz "
                   "with x (samples, features) float and y (samples,) integer labels, optionally x_test, y_test")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=d.shuffle,
                   help="shuffle the training rows each epoch (by --seed); --no-shuffle: file order")
    p.add_argument("--init-weights", default=d.init_weights, help="start from this consolidated .npz")
    p.add_argument("--save-weights", default=d.save_weights, help="save final weights to this .npz")
    p.add_argument("--save-dir", default=d.save_dir,
                   help="write sharded checkpoints here (at the end, every --save-every steps, and on "
                        "SIGTERM/SIGUSR1)")
    p.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint every this many steps "
                   "(0: only at the end)")
    p.add_argument("--keep-last", type=int, default=d.keep_last, help="newest checkpoints to keep (0: all)")
    p.add_argument("--resume", nargs="?", const="latest", default=d.resume,
                   help="--resume: continue from --save-dir's newest checkpoint (start fresh if there "
                        "is none); --resume FOLDER: from that checkpoint, written with any N and stage")
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between progress lines (0: none)")
    p.add_argument("--report", default=d.report, metavar="{table,json,none}",
                   help="end-of-run ledger; json: stdout holds only the JSON report, progress goes to stderr")
    p.add_argument("--device", default=d.device, metavar="{" + ",".join(DEVICE_CHOICES) + "}",
                   help="where the arrays live: cpu (NumPy), gpu (CuPy, one GPU per rank from the local "
                        "rank), auto (the GPU when CuPy sees one)")
    p.add_argument("--comm", default=d.comm, metavar="{" + ",".join(COMM_CHOICES) + "}",
                   help="collectives through MPI (CUDA-aware or staged through pinned host memory), or "
                        "NCCL (GPU only; MPI still starts the job)")
    p.add_argument("--progress", default=d.progress, metavar="{auto,live,lines}",
                   help="live: a live step/loss/samples-per-second/ETA line on rank 0 (under mpirun the "
                        "ranks' output is a pipe: pass live); lines: the log lines only; auto: live on a terminal")
    p.add_argument("--metrics", default=d.metrics, help="write one JSON object per step to this .jsonl file")
    p.add_argument("--trace", default=d.trace, help="write every rank's compute and communication spans to this "
                   "Chrome trace .json file (open it in https://ui.perfetto.dev)")
    p.add_argument("--check-collectives", action=argparse.BooleanOptionalAction, default=d.check_collectives,
                   help="before each collective, check that every rank calls the same one (kind, size, "
                        "dtype, call site); stop naming both sides if not")
    p.add_argument("--collective-timeout", type=float, default=d.collective_timeout, metavar="SECONDS",
                   help="end the job when a collective waits longer than this for the other ranks (0: never)")
    p.add_argument("--config", default="", metavar="FILE",
                   help="read flags from a TOML file (keys: the long flag names) or, if it ends in .json, "
                        "a DeepSpeed config; flags on the command line win")
    p.add_argument("--deepspeed-config", default="", metavar="FILE",
                   help="read a DeepSpeed JSON config (zero_optimization.stage, batch sizes, fp16/bf16, "
                        "optimizer, gradient_clipping, scheduler); flags on the command line win")
    p.add_argument("--overlap", default=d.overlap, metavar="{on,off}",
                   help="on: run the collectives on a communication thread while backward and forward "
                        "compute (the results are bitwise the same either way)")
    p.add_argument("--bucket-mb", type=float, default=d.bucket_mb,
                   help="stages 0-1: start reducing gradients a bucket of consecutive layers of at least "
                        "this many MB at a time (0: every layer)")
    p.add_argument("--prefetch", type=int, default=d.prefetch,
                   help="stage 3, --overlap on: all-gather this many layers ahead (one layer buffer each)")
    return p


def device_choice(argv):
    """--device from the command line, or from the TOML file --config names, read before MPI
    starts (zerompi/devices/device.py says why); any problem reads as the default, and the full parse
    reports it later."""
    peek = _Parser(rank=None, add_help=False)
    peek.add_argument("--device")
    peek.add_argument("--config", default="")
    try:
        args = peek.parse_known_args(argv)[0]
        if args.device is None and args.config and not args.config.endswith(".json"):
            args = peek.parse_known_args(flags_from_file(args.config, False, _file_keys(), 1, TrainConfig.lr))[0]
    except (ArgumentError, ConfigFileError):
        return TrainConfig.device
    return args.device or TrainConfig.device


def _file_keys():
    """{long flag name: True for a --x/--no-x switch}: the keys a TOML config file may hold."""
    return {f.name.replace("_", "-"): isinstance(f.default, bool) for f in fields(TrainConfig)}


def parse_args(argv, rank=0, num_ranks=1):
    """TrainConfig from a command line and the config file it names (zerompi/train/config_files.py);
    raises ArgumentError with a one-line message."""
    parser = build_parser(rank)
    files = _Parser(rank, add_help=False)
    files.add_argument("--config", default="")
    files.add_argument("--deepspeed-config", default="")
    path = files.parse_known_args(argv)[0]
    if path.config and path.deepspeed_config:
        raise ArgumentError("--config and --deepspeed-config: choose one")
    if path.config or path.deepspeed_config:
        name = path.config or path.deepspeed_config
        try:
            file_flags = flags_from_file(name, bool(path.deepspeed_config) or name.endswith(".json"),
                                         _file_keys(), num_ranks, TrainConfig.lr)
            from_file = build_parser(rank).parse_args(file_flags)
        except ConfigFileError as e:
            raise ArgumentError(str(e)) from None
        except ArgumentError as e:
            raise ArgumentError(f"{name}: {e}") from None
        parser.set_defaults(**{f.name: getattr(from_file, f.name) for f in fields(TrainConfig)})
    args = parser.parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def check_config(cfg, num_ranks):
    """The first problem with cfg for N = num_ranks, as a one-line message, or None."""
    if cfg.stage not in (0, 1, 2, 3):
        return f"unknown --stage {cfg.stage}: choose 0, 1, 2 or 3"
    if cfg.dtype not in DTYPE_NAMES:
        return f"unknown --dtype {cfg.dtype!r}: choose float32, float64, bf16 or fp16"
    if cfg.lr_schedule not in SCHEDULES:
        return f"unknown --lr-schedule {cfg.lr_schedule!r}: choose {' or '.join(SCHEDULES)}"
    if cfg.report not in ("table", "json", "none"):
        return f"unknown --report {cfg.report!r}: choose table, json or none"
    if cfg.device not in DEVICE_CHOICES:
        return f"unknown --device {cfg.device!r}: choose {', '.join(DEVICE_CHOICES)}"
    if cfg.comm not in COMM_CHOICES:
        return f"unknown --comm {cfg.comm!r}: choose {' or '.join(COMM_CHOICES)}"
    if cfg.comm == "nccl" and cfg.device == "cpu":
        return "--comm nccl needs --device gpu (NCCL moves GPU memory only)"
    if cfg.progress not in ("auto", "live", "lines"):
        return f"unknown --progress {cfg.progress!r}: choose auto, live or lines"
    if cfg.overlap not in ("on", "off"):
        return f"unknown --overlap {cfg.overlap!r}: choose on or off"
    if not (math.isfinite(cfg.bucket_mb) and cfg.bucket_mb >= 0):
        return f"--bucket-mb must be a finite number >= 0, got {cfg.bucket_mb}"
    if cfg.prefetch < 0:
        return f"--prefetch must be >= 0, got {cfg.prefetch}"
    for name in ("batch_size", "steps", "grad_accum", "loss_scale_window"):
        if getattr(cfg, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}"
    if cfg.classes < 0:
        return f"--classes must be positive (or 0 for: from the labels), got {cfg.classes}"
    if cfg.save_every < 0 or cfg.keep_last < 0:
        return f"--save-every and --keep-last must be >= 0, got {cfg.save_every} and {cfg.keep_last}"
    if (cfg.save_every or cfg.resume == "latest") and not cfg.save_dir:
        return "--save-every and --resume (without a folder) need --save-dir"
    if cfg.resume and cfg.init_weights:
        return "--resume and --init-weights both set the starting weights: choose one"
    if cfg.log_every < 0:
        return f"--log-every must be >= 0, got {cfg.log_every}"
    if cfg.warmup_steps < 0:
        return f"--warmup-steps must be >= 0, got {cfg.warmup_steps}"
    parts = num_ranks * cfg.grad_accum
    if cfg.batch_size % parts != 0:
        split = f"{num_ranks} ranks" + (f" x {cfg.grad_accum} micro-batches" if cfg.grad_accum > 1 else "")
        return f"--batch-size {cfg.batch_size} cannot be split evenly over {split}: use a multiple of {parts}"
    if cfg.seed < 0:
        return f"--seed must be >= 0, got {cfg.seed}"
    for name in ("lr", "weight_decay", "beta1", "beta2", "eps", "min_lr", "clip_norm", "loss_scale",
                 "min_loss_scale"):
        if not math.isfinite(getattr(cfg, name)):
            return f"--{name.replace('_', '-')} must be a finite number, got {getattr(cfg, name)}"
    if not cfg.lr > 0:
        return f"--lr must be positive, got {cfg.lr}"
    if not cfg.weight_decay >= 0:
        return f"--weight-decay must be >= 0, got {cfg.weight_decay}"
    if not (0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1):
        return f"--beta1 and --beta2 must be in [0, 1), got {cfg.beta1} and {cfg.beta2}"
    if not cfg.eps > 0:
        return f"--eps must be positive, got {cfg.eps}"
    if not 0 <= cfg.min_lr <= cfg.lr:
        return f"--min-lr must be in [0, --lr], got {cfg.min_lr}"
    if cfg.clip_norm < 0:
        return f"--clip-norm must be >= 0 (0: off), got {cfg.clip_norm}"
    if not (math.isfinite(cfg.collective_timeout) and cfg.collective_timeout >= 0):
        return f"--collective-timeout must be >= 0 seconds (0: off), got {cfg.collective_timeout}"
    if not cfg.loss_scale > 0 or not cfg.min_loss_scale > 0:
        return f"--loss-scale and --min-loss-scale must be positive, got {cfg.loss_scale}, {cfg.min_loss_scale}"
    return None
