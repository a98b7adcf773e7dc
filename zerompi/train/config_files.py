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

Every value is read with DeepSpeed's type (a boolean is a JSON true/false, a number is not a
string, `optimizer.params` is an object, ...); a value of another type is one line naming it.
"auto", which DeepSpeed accepts where Hugging Face Transformers and Accelerate fill the value in
(the batch sizes, gradient_clipping, fp16/bf16.enabled, optimizer.params lr, betas, eps,
weight_decay, scheduler.params warmup_min_lr, warmup_max_lr, warmup_num_steps, total_num_steps),
is refused with one line: zerompi does not resolve it yet.

Config files are read only if they are regular files (a FIFO would block before MPI starts), and
a file nested too deeply for the parser (JSON or TOML) is one line, not a RecursionError.
"""
import json
import sys
from dataclasses import dataclass

from ..inputs import open_regular

if sys.version_info >= (3, 11):
    import tomllib
else:                                          # pragma: no cover (Python 3.10)
    import tomli as tomllib


class ConfigFileError(Exception):
    """A bad config file; str(e) is the one-line message."""


@dataclass(frozen=True)
class Kind:
    """A JSON type a DeepSpeed key takes: `accepts(value)`, and how a message names it."""
    name: str
    accepts: object


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


INTEGER = Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = Kind("a number", _is_number)
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
TWO_NUMBERS = Kind("a list of two numbers", lambda v: isinstance(v, list) and len(v) == 2 and all(map(_is_number, v)))

# the keys where Transformers and Accelerate accept "auto" and fill in a value
AUTO_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas",
             "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
             "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
             "scheduler.params.total_num_steps"}
MAX_SCALE_POWER = 127                          # the initial loss scale 2^power must fit float32


def flags_from_file(path, deepspeed, known_flags, num_ranks, default_lr):
    """Command-line flags [--name, value, ...] for the TOML file at path (deepspeed False) or the
    DeepSpeed JSON at path (True); known_flags: {long flag name (without the dashes): the type of its
    value, bool for a --x/--no-x switch};
    default_lr: --lr's default (for a cosine floor given as a ratio of an lr the file leaves out)."""
    with open_regular(path, _unreadable) as f:
        try:
            text = f.read()
        except OSError as e:
            raise ConfigFileError(f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        table = json.loads(text) if deepspeed else tomllib.loads(text.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path} is not valid {'JSON' if deepspeed else 'TOML'}: {_one_line(e)}") from None
    except RecursionError:
        raise ConfigFileError(f"{path} is not valid {'JSON' if deepspeed else 'TOML'}: nested too deeply "
                              f"(a config file has a few levels)") from None
    if not isinstance(table, dict):
        raise ConfigFileError(f"{path}: expected a JSON object at the top level")
    return deepspeed_flags(table, num_ranks, path, default_lr) if deepspeed else toml_flags(table, known_flags, path)


def _unreadable(message):
    """ConfigFileError for open_regular's message (which names the file)."""
    return ConfigFileError(f"cannot read config file {message}")


def _integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


# a flag's type -> (does a TOML value fit it, what the message asks for)
TOML_TYPES = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (_integer, "an integer"),
    float: (lambda v: _integer(v) or isinstance(v, float), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
    tuple: (lambda v: isinstance(v, list) and all(map(_integer, v)), "a list of integers"),
}


def toml_flags(table, known_flags, path):
    """[--name, value, ...] for a TOML table; known_flags: {long flag name: the type of its value};
    every value must be of its flag's type (a string is no number, `true` is no path)."""
    flags, unknown = [], []
    for key, value in table.items():
        if key not in known_flags or key in ("config", "deepspeed-config") or isinstance(value, dict):
            unknown.append(_name(key))
        elif not TOML_TYPES[known_flags[key]][0](value):
            raise ConfigFileError(f"{path}: {key}={_shown(value)} must be {TOML_TYPES[known_flags[key]][1]}")
        elif known_flags[key] is bool:                                  # overlap = true: --overlap
            flags.append(f"--{key}" if value else f"--no-{key}")
        elif known_flags[key] is tuple:                                 # hidden = [256, 256]
            flags += [f"--{key}", ",".join(map(str, value))]
        else:
            flags += [f"--{key}", str(value)]
    if unknown:
        raise ConfigFileError(f"{path}: unknown keys: {', '.join(unknown)} (the keys are the long flag "
                              f"names without the dashes, see --help)")
    return flags


def typed(table, prefix, key, kind, path, default=None):
    """table[key] if it is of `kind` (default where absent); else ConfigFileError, one line naming
    prefix + key. "auto" in AUTO_KEYS gets its own line: zerompi does not resolve it yet."""
    if key not in table:
        return default
    value, name = table[key], prefix + key
    if value == "auto" and name in AUTO_KEYS:
        raise ConfigFileError(f'{path}: {name} is "auto": zerompi does not resolve "auto" yet; give a value')
    if not kind.accepts(value):
        raise ConfigFileError(f"{path}: {name}={_shown(value)} must be {kind.name}")
    return value


def deepspeed_flags(ds, num_ranks, path, default_lr):
    flags = {}                                   # flag -> value
    unsupported = []                             # "key" or "key=value (why)", in file order

    def leftovers(prefix, table, mapped):
        unsupported.extend(_name(f"{prefix}{key}") for key in table if key not in mapped)

    known = {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps", "fp16", "bf16", "optimizer", "gradient_clipping",
             "scheduler", "steps_per_print"}
    leftovers("", ds, known)

    zero = typed(ds, "", "zero_optimization", OBJECT, path, {})
    leftovers("zero_optimization.", zero, {"stage"})
    if "stage" in zero:
        flags["--stage"] = typed(zero, "zero_optimization.", "stage", INTEGER, path)

    batch = _batch_flags(ds, num_ranks, path)
    flags.update(batch)

    fp16, bf16 = typed(ds, "", "fp16", OBJECT, path, {}), typed(ds, "", "bf16", OBJECT, path, {})
    leftovers("bf16.", bf16, {"enabled"})
    fp16_on = typed(fp16, "fp16.", "enabled", BOOLEAN, path, False)
    bf16_on = typed(bf16, "bf16.", "enabled", BOOLEAN, path, False)
    loss_scale = typed(fp16, "fp16.", "loss_scale", NUMBER, path, 0)
    hysteresis = typed(fp16, "fp16.", "hysteresis", INTEGER, path, 1)
    power = typed(fp16, "fp16.", "initial_scale_power", INTEGER, path)
    if power is not None and not 0 <= power <= MAX_SCALE_POWER:
        raise ConfigFileError(f"{path}: fp16.initial_scale_power={power} must be an integer from 0 to "
                              f"{MAX_SCALE_POWER} (the initial loss scale is 2^power)")
    window = typed(fp16, "fp16.", "loss_scale_window", INTEGER, path)
    min_scale = typed(fp16, "fp16.", "min_loss_scale", NUMBER, path)
    if fp16_on and bf16_on:
        raise ConfigFileError(f"{path}: fp16.enabled and bf16.enabled are both true: choose one")
    if bf16_on:
        flags["--dtype"] = "bf16"
    if fp16_on:
        flags["--dtype"] = "fp16"
        leftovers("fp16.", fp16, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                                  "min_loss_scale", "hysteresis"})
        if loss_scale != 0:
            unsupported.append(f"fp16.loss_scale={loss_scale} (a static scale; 0: dynamic)")
        if hysteresis != 1:
            unsupported.append(f"fp16.hysteresis={hysteresis} (zerompi halves the scale at every overflow: 1)")
        for flag, value in (("--loss-scale", None if power is None else 2.0 ** power),
                            ("--loss-scale-window", window), ("--min-loss-scale", min_scale)):
            if value is not None:
                flags[flag] = value

    optimizer = typed(ds, "", "optimizer", OBJECT, path, {})
    leftovers("optimizer.", optimizer, {"type", "params"})
    if optimizer:
        kind = typed(optimizer, "optimizer.", "type", TEXT, path, "")
        if kind.lower() not in ("adam", "adamw"):
            unsupported.append(f"optimizer.type={_shown(kind)} (Adam or AdamW)")
        params = typed(optimizer, "optimizer.", "params", OBJECT, path, {})
        leftovers("optimizer.params.", params, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"})
        if typed(params, "optimizer.params.", "adam_w_mode", BOOLEAN, path, True) is not True:
            unsupported.append("optimizer.params.adam_w_mode=false (zerompi's Adam decouples weight decay)")
        for key, flag in (("lr", "--lr"), ("eps", "--eps"), ("weight_decay", "--weight-decay")):
            if key in params:
                flags[flag] = typed(params, "optimizer.params.", key, NUMBER, path)
        if "betas" in params:
            flags["--beta1"], flags["--beta2"] = typed(params, "optimizer.params.", "betas", TWO_NUMBERS, path)

    if "gradient_clipping" in ds:
        flags["--clip-norm"] = typed(ds, "", "gradient_clipping", NUMBER, path)
    if "steps_per_print" in ds:
        flags["--log-every"] = typed(ds, "", "steps_per_print", INTEGER, path)

    scheduler = typed(ds, "", "scheduler", OBJECT, path, {})
    leftovers("scheduler.", scheduler, {"type", "params"})
    if scheduler:
        flags.update(_scheduler_flags(scheduler, flags.get("--lr", default_lr), unsupported, path))

    if unsupported:
        raise ConfigFileError(f"{path}: unsupported DeepSpeed settings: {', '.join(unsupported)}")
    return [str(token) for flag, value in flags.items() for token in (flag, value)]


def _batch_flags(ds, num_ranks, path):
    """--batch-size (global) and --grad-accum from DeepSpeed's three batch keys, any two of which
    determine the third: train_batch_size = micro x accumulation x N."""
    total = typed(ds, "", "train_batch_size", INTEGER, path)
    micro = typed(ds, "", "train_micro_batch_size_per_gpu", INTEGER, path)
    accumulation = typed(ds, "", "gradient_accumulation_steps", INTEGER, path)
    given = [v for v in (total, micro, accumulation) if v is not None]
    if not all(v > 0 for v in given):
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


def _scheduler_flags(scheduler, lr, unsupported, path):
    """WarmupLR and WarmupCosineLR with a linear warm-up from 0, zerompi's two schedules."""
    kind = typed(scheduler, "scheduler.", "type", TEXT, path)
    params = typed(scheduler, "scheduler.", "params", OBJECT, path, {})
    mapped = {"WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
              "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                 "warmup_type"}}
    if kind not in mapped:
        unsupported.append(f"scheduler.type={kind!r} (WarmupLR or WarmupCosineLR)")
        return {}
    unsupported.extend(_name(f"scheduler.params.{key}") for key in params if key not in mapped[kind])

    def param(key, kind, default=None):
        return typed(params, "scheduler.params.", key, kind, path, default)

    warmup_type = param("warmup_type", TEXT, "log")
    if warmup_type != "linear":
        unsupported.append(f"scheduler.params.warmup_type={_shown(warmup_type)} (DeepSpeed's "
                           f"default is 'log'; zerompi warms up linearly: set 'linear')")
    start = "warmup_min_lr" if kind == "WarmupLR" else "warmup_min_ratio"
    if param(start, NUMBER, 0) != 0:
        unsupported.append(f"scheduler.params.{start}={params[start]} (zerompi warms up from 0)")
    flags = {"--lr-schedule": "constant" if kind == "WarmupLR" else "cosine"}
    if "warmup_num_steps" in params:
        flags["--warmup-steps"] = param("warmup_num_steps", INTEGER)
    if kind == "WarmupLR" and "warmup_max_lr" in params:
        flags["--lr"] = param("warmup_max_lr", NUMBER)
    if kind == "WarmupCosineLR":
        if "total_num_steps" in params:
            flags["--steps"] = param("total_num_steps", INTEGER)
        if "cos_min_ratio" in params:
            flags["--min-lr"] = param("cos_min_ratio", NUMBER) * float(lr)
    return flags


def _name(key):
    """A key as a message shows it: as it is, or quoted with escapes where it has a line break or
    another unprintable character."""
    return key if key.isprintable() else repr(key)


def _shown(value, limit=60):
    """repr(value) on one line, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_line(error):
    return " ".join(str(error).split())
