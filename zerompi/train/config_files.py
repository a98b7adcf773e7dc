"""Config files: a TOML file of zerompi's own flags, or a DeepSpeed-style JSON config.

Both are turned into command-line flags, which zerompi/train/config.py parses before the real command
line, so a flag given on the command line wins over the file, and every value goes through the
same type checks and error messages as a flag.

TOML (`--config run.toml`): the keys are the long flag names without the dashes
(`batch-size = 256`, `hidden = [256, 256]`, `shuffle = false`, `overlap = true`).

DeepSpeed JSON (`--deepspeed-config ds.json`, or `--config ds.json`), mapped where zerompi has the
same thing; any other key, or a value zerompi cannot honour, is an error naming every such key:

    zero_optimization.stage                         --stage
    train_batch_size = micro x accumulation x N     --batch-size (the global batch), derived from
    train_micro_batch_size_per_gpu                  whichever two are given, like DeepSpeed; all
    gradient_accumulation_steps                     three must agree
    fp16.enabled / bf16.enabled                     --dtype fp16 / bf16 (fp32 master and Adam state)
    fp16.initial_scale_power, loss_scale_window,    --loss-scale 2^power, --loss-scale-window,
        min_loss_scale, loss_scale (0: dynamic)         --min-loss-scale; hysteresis 1 only
    optimizer.type Adam / AdamW                     AdamW (DeepSpeed's Adam is AdamW by default)
    optimizer.params lr, betas, eps, weight_decay   --lr, --beta1 --beta2, --eps, --weight-decay
    gradient_clipping                               --clip-norm
    scheduler WarmupLR (linear, from 0)             --warmup-steps, --lr warmup_max_lr, constant
    scheduler WarmupCosineLR (linear, from 0)       --warmup-steps, --steps total_num_steps, cosine,
                                                    --min-lr cos_min_ratio x lr
    steps_per_print                                 --log-every
"""
import json
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:                                          # pragma: no cover (Python 3.10)
    import tomli as tomllib


class ConfigFileError(Exception):
    """A bad config file; str(e) is the one-line message."""


def flags_from_file(path, deepspeed, known_flags, num_ranks, default_lr):
    """Command-line flags [--name, value, ...] for the TOML file at path (deepspeed False) or the
    DeepSpeed JSON at path (True); known_flags: {long flag name (without the dashes): True for a
    --x/--no-x switch};
    default_lr: --lr's default (for a cosine floor given as a ratio of an lr the file leaves out)."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        table = json.loads(text) if deepspeed else tomllib.loads(text.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path} is not valid {'JSON' if deepspeed else 'TOML'}: {e}") from None
    if not isinstance(table, dict):
        raise ConfigFileError(f"{path}: expected a JSON object at the top level")
    return deepspeed_flags(table, num_ranks, path, default_lr) if deepspeed else toml_flags(table, known_flags, path)


def toml_flags(table, known_flags, path):
    flags, unknown = [], []
    for key, value in table.items():
        if key not in known_flags or key in ("config", "deepspeed-config") or isinstance(value, dict):
            unknown.append(key)
        elif (value is True or value is False) and known_flags[key]:    # overlap = true: --overlap
            flags.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, list):
            flags += [f"--{key}", ",".join(map(str, value))]
        else:
            flags += [f"--{key}", str(value)]
    if unknown:
        raise ConfigFileError(f"{path}: unknown keys: {', '.join(unknown)} (the keys are the long flag "
                              f"names without the dashes, see --help)")
    return flags


def deepspeed_flags(ds, num_ranks, path, default_lr):
    flags = {}                                   # flag -> value
    unsupported = []                             # "key" or "key=value (why)", in file order

    def section(name):
        value = ds.get(name, {})
        if not isinstance(value, dict):
            unsupported.append(f"{name}={value!r} (expected an object)")
            return {}
        return value

    def leftovers(prefix, table, mapped):
        unsupported.extend(f"{prefix}{key}" for key in table if key not in mapped)

    known = {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps", "fp16", "bf16", "optimizer", "gradient_clipping",
             "scheduler", "steps_per_print"}
    leftovers("", ds, known)

    zero = section("zero_optimization")
    leftovers("zero_optimization.", zero, {"stage"})
    if "stage" in zero:
        flags["--stage"] = zero["stage"]

    batch = _batch_flags(ds, num_ranks, path)
    flags.update(batch)

    fp16, bf16 = section("fp16"), section("bf16")
    leftovers("bf16.", bf16, {"enabled"})
    if fp16.get("enabled") and bf16.get("enabled"):
        raise ConfigFileError(f"{path}: fp16.enabled and bf16.enabled are both true: choose one")
    if bf16.get("enabled"):
        flags["--dtype"] = "bf16"
    if fp16.get("enabled"):
        flags["--dtype"] = "fp16"
        leftovers("fp16.", fp16, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                                  "min_loss_scale", "hysteresis"})
        if fp16.get("loss_scale", 0) != 0:
            unsupported.append(f"fp16.loss_scale={fp16['loss_scale']} (a static scale; 0: dynamic)")
        if fp16.get("hysteresis", 1) != 1:
            unsupported.append(f"fp16.hysteresis={fp16['hysteresis']} (zerompi halves the scale at every "
                               f"overflow: 1)")
        if "initial_scale_power" in fp16:
            flags["--loss-scale"] = 2.0 ** fp16["initial_scale_power"]
        for key, flag in (("loss_scale_window", "--loss-scale-window"), ("min_loss_scale", "--min-loss-scale")):
            if key in fp16:
                flags[flag] = fp16[key]

    optimizer = section("optimizer")
    leftovers("optimizer.", optimizer, {"type", "params"})
    if optimizer:
        if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
            unsupported.append(f"optimizer.type={optimizer.get('type')!r} (Adam or AdamW)")
        params = optimizer.get("params", {})
        leftovers("optimizer.params.", params, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"})
        if params.get("adam_w_mode", True) is not True:
            unsupported.append("optimizer.params.adam_w_mode=false (zerompi's Adam decouples weight decay)")
        for key, flag in (("lr", "--lr"), ("eps", "--eps"), ("weight_decay", "--weight-decay")):
            if key in params:
                flags[flag] = params[key]
        if "betas" in params:
            betas = params["betas"]
            if not (isinstance(betas, list) and len(betas) == 2):
                unsupported.append(f"optimizer.params.betas={betas!r} (two numbers)")
            else:
                flags["--beta1"], flags["--beta2"] = betas

    if "gradient_clipping" in ds:
        flags["--clip-norm"] = ds["gradient_clipping"]
    if "steps_per_print" in ds:
        flags["--log-every"] = ds["steps_per_print"]

    scheduler = section("scheduler")
    leftovers("scheduler.", scheduler, {"type", "params"})
    if scheduler:
        flags.update(_scheduler_flags(scheduler, flags.get("--lr", default_lr), unsupported))

    if unsupported:
        raise ConfigFileError(f"{path}: unsupported DeepSpeed settings: {', '.join(unsupported)}")
    return [str(token) for flag, value in flags.items() for token in (flag, value)]


def _batch_flags(ds, num_ranks, path):
    """--batch-size (global) and --grad-accum from DeepSpeed's three batch keys, any two of which
    determine the third: train_batch_size = micro x accumulation x N."""
    total = ds.get("train_batch_size")
    micro = ds.get("train_micro_batch_size_per_gpu")
    accumulation = ds.get("gradient_accumulation_steps")
    given = [v for v in (total, micro, accumulation) if v is not None]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given):
        raise ConfigFileError(f"{path}: train_batch_size, train_micro_batch_size_per_gpu and "
                              f"gradient_accumulation_steps must be positive integers")
    if micro is not None and accumulation is not None:
        if total is not None and total != micro * accumulation * num_ranks:
            raise ConfigFileError(
                f"{path}: inconsistent batch sizes: train_batch_size {total} != train_micro_batch_size_per_gpu "
                f"{micro} x gradient_accumulation_steps {accumulation} x {num_ranks} ranks = "
                f"{micro * accumulation * num_ranks}")
        total = micro * accumulation * num_ranks
    elif micro is not None and total is not None:
        if total % (micro * num_ranks):
            raise ConfigFileError(f"{path}: inconsistent batch sizes: train_batch_size {total} is not a multiple "
                                  f"of train_micro_batch_size_per_gpu {micro} x {num_ranks} ranks")
        accumulation = total // (micro * num_ranks)
    elif micro is not None:
        total = micro * num_ranks
    flags = {}
    if total is not None:
        flags["--batch-size"] = total
    if accumulation is not None:
        flags["--grad-accum"] = accumulation
    return flags


def _scheduler_flags(scheduler, lr, unsupported):
    """WarmupLR and WarmupCosineLR with a linear warm-up from 0, zerompi's two schedules."""
    kind, params = scheduler.get("type"), scheduler.get("params", {})
    mapped = {"WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
              "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                 "warmup_type"}}
    if kind not in mapped:
        unsupported.append(f"scheduler.type={kind!r} (WarmupLR or WarmupCosineLR)")
        return {}
    unsupported.extend(f"scheduler.params.{key}" for key in params if key not in mapped[kind])
    if params.get("warmup_type", "log") != "linear":
        unsupported.append(f"scheduler.params.warmup_type={params.get('warmup_type', 'log')!r} (DeepSpeed's "
                           f"default is 'log'; zerompi warms up linearly: set 'linear')")
    start = "warmup_min_lr" if kind == "WarmupLR" else "warmup_min_ratio"
    if params.get(start, 0) != 0:
        unsupported.append(f"scheduler.params.{start}={params[start]} (zerompi warms up from 0)")
    flags = {"--lr-schedule": "constant" if kind == "WarmupLR" else "cosine"}
    if "warmup_num_steps" in params:
        flags["--warmup-steps"] = params["warmup_num_steps"]
    if kind == "WarmupLR" and "warmup_max_lr" in params:
        flags["--lr"] = params["warmup_max_lr"]
    if kind == "WarmupCosineLR":
        if "total_num_steps" in params:
            flags["--steps"] = params["total_num_steps"]
        if "cos_min_ratio" in params:
            flags["--min-lr"] = params["cos_min_ratio"] * float(lr)
    return flags
