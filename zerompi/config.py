"""Training configuration: one dataclass with commented defaults, its command line, its checks.

The defaults train the embedded synthetic set with `mpirun -n 8 python -m zerompi.train` in well
under a minute on 2 cores. Every check here runs identically on every rank (it depends only on the
arguments and N), so every rank reaches the same verdict without communicating.
"""
import argparse
import math
from dataclasses import dataclass, fields

DTYPES = ("float32", "float64")


@dataclass
class TrainConfig:
    stage: int = 3                  # ZeRO stage: 0 (plain data parallel), 1, 2 or 3
    hidden: tuple = (128, 128)      # hidden layer widths; input and output widths come from the data
    classes: int = 0                # output width; 0: 1 + the largest label in the data
    batch_size: int = 256           # GLOBAL batch: rows per step summed over all ranks
    steps: int = 300                # optimizer steps
    lr: float = 3e-3                # AdamW learning rate
    weight_decay: float = 0.01      # AdamW decoupled weight decay
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    seed: int = 0                   # initial weights and the shuffling of batches
    dtype: str = "float32"          # parameters, gradients and Adam state
    data: str = ""                  # .npz with x, y (and optionally x_test, y_test); "": synthetic
    shuffle: bool = True            # shuffle the training rows every epoch (by seed), else in order
    init_weights: str = ""          # start from this consolidated .npz instead of a random init
    save_weights: str = ""          # write the final weights here as one consolidated .npz
    log_every: int = 25             # print loss and accuracy every this many steps (0: never)
    report: str = "table"           # end-of-run ledger: table, json (only JSON on stdout) or none


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
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch (divisible by N)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW decoupled weight decay")
    p.add_argument("--beta1", type=float, default=d.beta1, help="AdamW first-moment decay")
    p.add_argument("--beta2", type=float, default=d.beta2, help="AdamW second-moment decay")
    p.add_argument("--eps", type=float, default=d.eps, help="AdamW denominator epsilon")
    p.add_argument("--seed", type=int, default=d.seed, help="initial weights and batch order")
    p.add_argument("--dtype", default=d.dtype, metavar="{" + ",".join(DTYPES) + "}",
                   help="parameters, gradients and Adam state")
    p.add_argument("--data", default=d.data, help=".npz with x (samples, features) float and y (samples,) "
                   "integer labels, optionally x_test and y_test; empty: the embedded synthetic set")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=d.shuffle,
                   help="shuffle the training rows each epoch (by --seed); --no-shuffle: file order")
    p.add_argument("--init-weights", default=d.init_weights, help="start from this consolidated .npz")
    p.add_argument("--save-weights", default=d.save_weights, help="save final weights to this .npz")
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between progress lines (0: none)")
    p.add_argument("--report", default=d.report, metavar="{table,json,none}",
                   help="end-of-run ledger; json: stdout holds only the JSON report, progress goes to stderr")
    return p


def parse_args(argv, rank=0):
    """TrainConfig from a command line; raises ArgumentError with a one-line message."""
    args = build_parser(rank).parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def check_config(cfg, num_ranks):
    """The first problem with cfg for N = num_ranks, as a one-line message, or None."""
    if cfg.stage not in (0, 1, 2, 3):
        return f"unknown --stage {cfg.stage}: choose 0, 1, 2 or 3"
    if cfg.dtype not in DTYPES:
        return f"unknown --dtype {cfg.dtype!r}: choose one of {', '.join(DTYPES)}"
    if cfg.report not in ("table", "json", "none"):
        return f"unknown --report {cfg.report!r}: choose table, json or none"
    for name in ("batch_size", "steps"):
        if getattr(cfg, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}"
    if cfg.classes < 0:
        return f"--classes must be positive (or 0 for: from the labels), got {cfg.classes}"
    if cfg.log_every < 0:
        return f"--log-every must be >= 0, got {cfg.log_every}"
    if cfg.batch_size % num_ranks != 0:
        return (f"--batch-size {cfg.batch_size} cannot be split evenly over {num_ranks} ranks: "
                f"use a multiple of {num_ranks}")
    if cfg.seed < 0:
        return f"--seed must be >= 0, got {cfg.seed}"
    for name in ("lr", "weight_decay", "beta1", "beta2", "eps"):
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
    return None
