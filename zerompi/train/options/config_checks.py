"""The checks of a TrainConfig: the first problem, as one line naming the flag, or None.

check_config runs identically on every rank (it depends only on the values, N and the files the
paths name), so every rank reaches the same verdict without communicating. Besides the ranges it
refuses the values that pass them but make the arithmetic vanish or flip, judged as the update
computes them, in the run's compute dtype (vanishing_value_error):

    --eps          Adam adds eps sqrt(1 - beta2^t) to sqrt(v): 0 there, and an element whose
                   gradient is 0 divides 0 by 0 (reported as divergence, "lower --lr")
    --lr           the largest learning rate the run reaches (--lr, or less while it warms up)
                   rounds to 0: no update changes anything, and the run ends "done"
    --clip-norm    a clipped gradient's elements square to 0 in v: the update is lr m / eps, 0
    --weight-decay the decoupled decay multiplies every weight by 1 - lr wd each step: at 0 or below
                   it zeroes or flips them all (--weight-decay 1e300 read as "lower --lr")
"""
import math

import numpy as np

from .output_paths import output_overwrites_input


def check_config(cfg, num_ranks):
    """The first problem with cfg for N = num_ranks, as a one-line message, or None."""
    if cfg.comm == "nccl" and cfg.device == "cpu":
        return "--comm nccl needs --device gpu (NCCL moves GPU memory only)"
    if not (math.isfinite(cfg.bucket_mb) and cfg.bucket_mb >= 0):
        return f"--bucket-mb must be a finite number >= 0, got {cfg.bucket_mb}"
    if "file" in (cfg.offload_optimizer, cfg.offload_params) and not cfg.offload_dir:
        return f"--offload-{'optimizer' if cfg.offload_optimizer == 'file' else 'params'} file needs --offload-dir DIR"
    if cfg.offload_dir and "file" not in (cfg.offload_optimizer, cfg.offload_params):
        return "--offload-dir is the folder of --offload-optimizer file or --offload-params file: pass one or neither"
    if cfg.offload_params != "none" and (cfg.stage != 3 or cfg.offload_optimizer == "none" or cfg.overlap
                                         or cfg.hpz or cfg.shard_group != "world"):
        return ("--offload-params is stage 3's, with --offload-optimizer host or file (the update runs on the CPU, "
                "where the parameters are), without --overlap, --hpz or --shard-group")
    if cfg.quantize_weights != "none" and (cfg.stage != 3 or cfg.overlap or cfg.shard_group != "world"):
        return ("--quantize-weights is stage 3's (its parameter all-gathers), without --overlap or --shard-group")
    if cfg.quantize_grads != "none" and (cfg.stage < 2 or cfg.overlap or cfg.shard_group != "world"
                                         or cfg.comm == "nccl"):
        return "--quantize-grads is stages 2 and 3's (their reduce-scatters), without --overlap, --shard-group or --comm nccl"
    if cfg.keep_last_layer and cfg.stage != 3:
        return "--keep-last-layer keeps stage 3's last layer gathered into backward: it needs --stage 3"
    if cfg.quant_error and cfg.quantize_weights == cfg.quantize_grads == "none":
        return "--quant-error measures --quantize-weights and --quantize-grads: pass one of them"
    if cfg.in_process_ranks < 0 or cfg.in_process_nodes < 1:
        return "--in-process-ranks must be >= 0 and --in-process-nodes >= 1"
    if cfg.in_process_ranks and cfg.comm == "nccl":
        return "--in-process-ranks runs on the CPU, without --comm nccl (docs/in-process.md)"
    if cfg.in_process_nodes != 1 and not cfg.in_process_ranks:
        return "--in-process-nodes groups --in-process-ranks: pass both"
    if cfg.quant_block < 1:
        return f"--quant-block must be >= 1, got {cfg.quant_block}"
    if cfg.prefetch < 0:
        return f"--prefetch must be >= 0, got {cfg.prefetch}"
    for name in ("steps", "loss_scale_window"):
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
    vanishing = vanishing_value_error(cfg)          # values the update loses
    if vanishing:
        return vanishing
    if not (math.isfinite(cfg.collective_timeout) and cfg.collective_timeout >= 0):
        return f"--collective-timeout must be >= 0 seconds (0: off), got {cfg.collective_timeout}"
    if not cfg.loss_scale > 0 or not cfg.min_loss_scale > 0:
        return f"--loss-scale and --min-loss-scale must be positive, got {cfg.loss_scale}, {cfg.min_loss_scale}"
    overwrites = output_overwrites_input(cfg)
    if overwrites is None and cfg.save_weights and not cfg.save_weights.endswith(".npz"):   # read by suffix
        return (f"--save-weights {cfg.save_weights} writes a consolidated .npz, so its name must end in .npz "
                f"(for safetensors: --save-dir, then python -m zerompi.checkpoint export CKPT OUT.safetensors)")
    return overwrites


def vanishing_value_error(cfg):
    """One line naming the value and why the update loses it, or None."""
    with np.errstate(over="ignore"):                         # a huge value rounds to inf: it vanishes not
        return _vanishing(cfg, cfg.precision.compute)   # (compute: where Adam's arithmetic runs)


def _vanishing(cfg, compute):
    eps_first = cfg.eps * math.sqrt(1.0 - cfg.beta2)
    if compute.type(eps_first) == 0 or compute.type(cfg.eps) == 0:
        return (f"--eps {cfg.eps!r} vanishes in {compute.name}: Adam adds eps sqrt(1 - beta2^t) ({eps_first:.3g} "
                f"at step 1), which rounds to 0 there, and an element whose gradient is 0 then divides 0 by 0: "
                f"pass a larger --eps (the default is 1e-08)")
    largest_lr = cfg.lr * min(1.0, cfg.steps / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    if compute.type(largest_lr) == 0:
        return (f"--lr {cfg.lr!r} vanishes in {compute.name}: the largest learning rate of the run "
                f"({largest_lr:.3g}{', in its warm-up' if largest_lr < cfg.lr else ''}) rounds to 0 there, and no "
                f"update would change a weight: pass a larger --lr")
    if cfg.clip_norm and compute.type(cfg.clip_norm ** 2 * (1.0 - cfg.beta2)) == 0:
        return (f"--clip-norm {cfg.clip_norm!r} vanishes in {compute.name}: a clipped gradient's elements square to "
                f"0 in Adam's second moment, and no update would change a weight: pass a larger --clip-norm (or 0: off)")
    if cfg.lr * cfg.weight_decay >= 1:
        return (f"--lr {cfg.lr:g} x --weight-decay {cfg.weight_decay:g} is {cfg.lr * cfg.weight_decay:.3g}: the "
                f"decoupled decay multiplies every weight by 1 - lr wd each step, which must stay above 0: pass a "
                f"smaller --weight-decay")
    return None
