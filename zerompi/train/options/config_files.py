"""Config files: a TOML file of zerompi's own flags, or a DeepSpeed-style JSON config.

Both are turned into command-line flags, which zerompi/train/options/config.py parses before the real command
line, so a flag given on the command line wins over the file, and every value goes through the
same type checks and error messages as a flag.

TOML (`--config run.toml`): the keys are the long flag names without the dashes
(`batch-size = 256`, `hidden = [256, 256]`, `shuffle = false`, `overlap = true`).

DeepSpeed JSON (`--deepspeed-config ds.json`, or `--config ds.json`), mapped where zerompi has the
same thing; a key zerompi does not know, or a value it cannot honour, is an error naming every
such key:

    zero_optimization.stage (0-3)                   --stage
    train_batch_size                                --batch-size      (global = micro x accumulation
    train_micro_batch_size_per_gpu                  --micro-batch-size    x N; any two decide the
    gradient_accumulation_steps                     --grad-accum          third: batch_rule.py)
    fp16.enabled / bf16.enabled                     --dtype fp16 / bf16 (fp32 master and Adam state)
    fp16.initial_scale_power, loss_scale_window,    --loss-scale 2^power, --loss-scale-window,
        min_loss_scale, loss_scale (0: dynamic)         --min-loss-scale; hysteresis 1 only
    optimizer.type Adam / AdamW                     AdamW (DeepSpeed's Adam is AdamW by default)
    optimizer.params lr, betas, eps, weight_decay   --lr, --beta1 --beta2, --eps, --weight-decay
    gradient_clipping                               --clip-norm
    scheduler WarmupLR (linear, from 0)             --warmup-steps, --lr warmup_max_lr, constant
    scheduler WarmupCosineLR (linear, from 0)       --warmup-steps, --steps total_num_steps, cosine,
                                                    --min-lr cos_min_ratio x lr
    zero_optimization.overlap_comm                  --overlap / --no-overlap
    zero_optimization.mics_shard_size (-1: off)     --shard-group S (hybrid sharding, MiCS)
    zero_optimization.zero_hpz_partition_size       --hpz when > 1 (1: off); the secondary
                                                    partition is over the ranks of each node
    zero_optimization.offload_optimizer.device,     --offload-optimizer, --offload-params host /
    offload_param.device: cpu / nvme, nvme_path     file (zerompi/offload/), --offload-dir nvme_path
    steps_per_print                                 --log-every

"auto" (which Hugging Face Transformers and Accelerate fill in) means: what the command line says,
or the flag's default, as if the key were absent. That is how the batch sizes (the one batch rule
decides), gradient_clipping, optimizer.params and scheduler.params (warmup_max_lr: --lr,
warmup_num_steps: --warmup-steps, total_num_steps: --steps, warmup_min_lr: 0) are read, and
fp16.enabled / bf16.enabled "auto" follow --dtype. fp16's loss-scale keys are the run's (and
checked) whenever the run is fp16, by the file or by --dtype; the section's keys are checked always. "auto" anywhere else is one line naming the key: nothing decides it.

Accepted and ignored, because they change nothing in what a step computes:

    wall_clock_breakdown, flops_profiler, timers,   timing, profiling and logging (zerompi's
    comms_logger, memory_breakdown, dump_state,     own: --trace, --metrics, the report)
    tensorboard, wandb, csv_monitor, comet
    zero_allow_untested_optimizer,                  which optimizers DeepSpeed allows: zerompi
    zero_force_ds_cpu_optimizer                     has one, AdamW
    zero_optimization.contiguous_gradients,         how DeepSpeed lays out and buckets its
    reduce_scatter, allgather_partitions,           buffers and collectives; the sums are the
    round_robin_gradients, allgather_bucket_size,   same. reduce_bucket_size is not mapped to
    reduce_bucket_size, sub_group_size,             --bucket-mb: its values (elements, tuned for
    stage3_prefetch_bucket_size,                    billion-parameter models, or "auto") would put
    stage3_param_persistence_threshold,             the whole MLP in one bucket; --prefetch counts
    stage3_max_live_parameters,                     layers, not elements
    stage3_max_reuse_distance
    zero_optimization.stage3_gather_16bit_weights_  --save-weights always writes consolidated
        on_model_save (and its old fp16 name)       weights
    zero_optimization.elastic_checkpoint,           zerompi's checkpoints load on any N;
    load_from_fp32_weights                          they hold the fp32 master weights
    fp16.auto_cast false, consecutive_hysteresis    (hysteresis is 1)

Refused with one line naming the key: offload_optimizer's keys but pin_memory, pipeline_* (true), fast_init,
buffer_count, ratio, offload_param's but pin_memory (true), buffer_count, buffer_size, max_in_cpu (speed
only), two nvme_paths, fp16.hysteresis > 1, a static loss scale, fp16.auto_cast true, other optimizers
and schedulers (WarmupDecayLR, OneCycle, ...), a stage outside 0-3, and every key not listed here.

Every value is read with DeepSpeed's type (a boolean is a JSON true/false, a number is not a
string, `optimizer.params` is an object, ...); a value of another type is one line naming it.

Config files are read only if regular files (a FIFO would block before MPI starts); one nested too
deeply for the parser (JSON or TOML) is one line, not a RecursionError.
"""
import json
import sys
from dataclasses import dataclass

from ...util.inputs import read_whole

if sys.version_info >= (3, 11):
    import tomllib
else:                                          # pragma: no cover (Python 3.10)
    import tomli as tomllib


class ConfigFileError(Exception):
    """A bad config file; str(e) is the one-line message."""


@dataclass(frozen=True)
class CommandLine:
    """The command line's --dtype and --lr (None: not given) and their defaults: "auto" and the
    fp16 section follow the dtype the run will have, and a cosine floor given as a ratio is of the
    lr it will have."""
    dtype: str | None
    lr: float | None
    default_dtype: str
    default_lr: float


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

# the keys where Transformers and Accelerate accept "auto" and fill in a value: here, what the
# command line (or the flag's default) says
AUTO_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas",
             "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
             "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
             "scheduler.params.total_num_steps"}
# keys that change nothing in what a step computes (the module docstring says why each)
IGNORED = {"wall_clock_breakdown", "flops_profiler", "timers", "comms_logger", "memory_breakdown", "dump_state",
           "tensorboard", "wandb", "csv_monitor", "comet", "zero_allow_untested_optimizer",
           "zero_force_ds_cpu_optimizer"}
ZERO_IGNORED = {"contiguous_gradients", "reduce_scatter", "allgather_partitions", "round_robin_gradients",
                "allgather_bucket_size", "reduce_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                "elastic_checkpoint", "load_from_fp32_weights"}
MAX_SCALE_POWER = 127                          # the initial loss scale 2^power must fit float32


def flags_from_file(path, deepspeed, known_flags, command_line):
    """(Command-line flags ["--name=value" or "--switch", ...], {flag: the key of the file it comes
    from}) for the TOML file at path (deepspeed False) or the DeepSpeed JSON at path (True); each
    value joined to its flag, so that one beginning with "-" (-1e-3, -x.npz) stays a value.
    known_flags: {long flag name (without the dashes): the type of its value, bool for a --x/--no-x
    switch}; command_line: what a DeepSpeed file is read against."""
    try:
        text = read_whole(path, _unreadable, "a config file")
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
    if deepspeed:
        return deepspeed_flags(table, path, command_line)
    return toml_flags(table, known_flags, path)


def _unreadable(message):
    """ConfigFileError for read_whole's message (which names the file)."""
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
    """(flags, {flag: key}) for a TOML table (flags_from_file); known_flags: {long flag name: the
    type of its value}; every value must be of its flag's type (a string is no number, `true` is no path)."""
    flags, unknown = [], []
    for key, value in table.items():
        if key not in known_flags or key in ("config", "deepspeed-config") or isinstance(value, dict):
            unknown.append(_name(key))
        elif not TOML_TYPES[known_flags[key]][0](value):
            raise ConfigFileError(f"{path}: {key}={_shown(value)} must be {TOML_TYPES[known_flags[key]][1]}")
        elif known_flags[key] is bool:                                  # overlap = true: --overlap
            flags.append(f"--{key}" if value else f"--no-{key}")
        elif known_flags[key] is tuple:                                 # hidden = [256, 256]
            flags.append(f"--{key}={','.join(map(str, value))}")
        else:
            flags.append(f"--{key}={value}")
    if unknown:
        raise ConfigFileError(f"{path}: unknown keys: {', '.join(unknown)} (the keys are the long flag "
                              f"names without the dashes, see --help)")
    return flags, {f"--{key}": key for key in table}


def typed(table, prefix, key, kind, path, default=None):
    """table[key] if it is of `kind` (default where absent, or "auto" in AUTO_KEYS: the command
    line decides); else ConfigFileError, one line naming prefix + key."""
    if key not in table:
        return default
    value, name = table[key], prefix + key
    if value == "auto":
        if name in AUTO_KEYS:
            return default
        raise ConfigFileError(f'{path}: {name} is "auto", which neither the command line nor the data '
                              f'decides in zerompi: give a value')
    if not kind.accepts(value):
        raise ConfigFileError(f"{path}: {name}={_shown(value)} must be {kind.name}")
    return value


def deepspeed_flags(ds, path, command_line):
    """[--name, value, ...] for a DeepSpeed config (the module docstring's table), read against
    command_line (a CommandLine)."""
    flags = {}                                   # flag -> value (None: a switch, no value)
    keys = {}                                    # flag -> the key it comes from
    unsupported = []                             # "key" or "key=value (why)", in file order

    def leftovers(prefix, table, mapped):
        unsupported.extend(_name(f"{prefix}{key}") for key in table if key not in mapped)

    def put(flag, value, key):
        if value is not None:                    # absent or "auto": the command line decides
            flags[flag], keys[flag] = value, key

    known = {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps", "fp16", "bf16", "optimizer", "gradient_clipping",
             "scheduler", "steps_per_print"}
    leftovers("", ds, known | IGNORED)

    zero = typed(ds, "", "zero_optimization", OBJECT, path, {})
    leftovers("zero_optimization.", zero, {"stage", "overlap_comm", "offload_optimizer", "offload_param",
                                           "mics_shard_size", "zero_hpz_partition_size"} | ZERO_IGNORED)
    stage = typed(zero, "zero_optimization.", "stage", INTEGER, path)
    if stage is not None and stage not in (0, 1, 2, 3):
        unsupported.append(f"zero_optimization.stage={stage} (0, 1, 2 or 3)")
    put("--stage", stage, "zero_optimization.stage")
    overlap = typed(zero, "zero_optimization.", "overlap_comm", BOOLEAN, path)
    if overlap is not None:
        flags["--overlap" if overlap else "--no-overlap"] = None
        keys["--overlap"] = "zero_optimization.overlap_comm"
    shard_size = typed(zero, "zero_optimization.", "mics_shard_size", INTEGER, path)
    if shard_size is not None and shard_size > 0:          # DeepSpeed's -1: off
        put("--shard-group", shard_size, "zero_optimization.mics_shard_size")
    hpz_size = typed(zero, "zero_optimization.", "zero_hpz_partition_size", INTEGER, path)
    if hpz_size is not None and hpz_size > 1:              # 1: off
        flags["--hpz"], keys["--hpz"] = None, "zero_optimization.zero_hpz_partition_size"
    for section, flag, pipeline, speed_only in (     # pipeline: what zerompi always does; the rest, speed only
            ("offload_optimizer", "--offload-optimizer", ("pin_memory", "pipeline_read", "pipeline_write"),
             ("fast_init", "buffer_count", "ratio")),
            ("offload_param", "--offload-params", ("pin_memory",), ("buffer_count", "buffer_size", "max_in_cpu"))):
        prefix = f"zero_optimization.{section}."
        offload = typed(zero, "zero_optimization.", section, OBJECT, path, {})
        device = typed(offload, prefix, "device", TEXT, path, "none")
        tier = {"none": "none", "cpu": "host", "nvme": "file"}.get(device)
        unsupported.extend([] if tier else [f"{prefix}device={_shown(device)} (none, cpu or nvme)"])
        if tier not in (None, "none"):           # with "none", DeepSpeed reads no other key of it
            leftovers(prefix, offload, {"device", "nvme_path", *speed_only, *pipeline})
            unsupported.extend(f"{prefix}{key}=false (zerompi always pins and pipelines its tiers)" for key in pipeline
                               if typed(offload, prefix, key, BOOLEAN, path, True) is False)
        nvme_path = typed(offload, prefix, "nvme_path", TEXT, path) if tier == "file" else flags.get("--offload-dir")
        unsupported.extend([f"{prefix}nvme_path={_shown(nvme_path)} (zerompi has one --offload-dir for both)"]
                           if flags.get("--offload-dir", nvme_path) != nvme_path else [])
        put(flag, tier, prefix + "device")
        put("--offload-dir", nvme_path if tier == "file" else None, prefix + "nvme_path")

    for key, flag in (("train_batch_size", "--batch-size"), ("train_micro_batch_size_per_gpu", "--micro-batch-size"),
                      ("gradient_accumulation_steps", "--grad-accum")):
        value = typed(ds, "", key, INTEGER, path)
        if value is not None and value <= 0:
            raise ConfigFileError(f"{path}: {key}={value} must be a positive integer")
        put(flag, value, key)                    # batch_rule.py resolves the three, like DeepSpeed

    fp16, bf16 = typed(ds, "", "fp16", OBJECT, path, {}), typed(ds, "", "bf16", OBJECT, path, {})
    leftovers("bf16.", bf16, {"enabled"})
    fp16_enabled, bf16_enabled = _enabled(fp16, "fp16", path), _enabled(bf16, "bf16", path)
    loss_scale = typed(fp16, "fp16.", "loss_scale", NUMBER, path, 0)
    hysteresis = typed(fp16, "fp16.", "hysteresis", INTEGER, path, 1)
    power = typed(fp16, "fp16.", "initial_scale_power", INTEGER, path)
    if power is not None and not 0 <= power <= MAX_SCALE_POWER:
        raise ConfigFileError(f"{path}: fp16.initial_scale_power={power} must be an integer from 0 to "
                              f"{MAX_SCALE_POWER} (the initial loss scale is 2^power)")
    window = typed(fp16, "fp16.", "loss_scale_window", INTEGER, path)
    min_scale = typed(fp16, "fp16.", "min_loss_scale", NUMBER, path)
    auto_cast = typed(fp16, "fp16.", "auto_cast", BOOLEAN, path, False)
    typed(fp16, "fp16.", "consecutive_hysteresis", BOOLEAN, path)
    if fp16_enabled is True and bf16_enabled is True:
        raise ConfigFileError(f"{path}: fp16.enabled and bf16.enabled are both true: choose one")
    if fp16_enabled is True or bf16_enabled is True:
        flags["--dtype"] = "fp16" if fp16_enabled is True else "bf16"
    dtype = command_line.dtype or flags.get("--dtype") or command_line.default_dtype      # the run's
    leftovers("fp16.", fp16, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                              "min_loss_scale", "hysteresis", "auto_cast", "consecutive_hysteresis"})
    if dtype == "fp16":                    # the loss-scale keys are the run's when it is fp16 (by any flag)
        if loss_scale != 0:
            unsupported.append(f"fp16.loss_scale={loss_scale} (a static scale; 0: dynamic)")
        if hysteresis != 1:
            unsupported.append(f"fp16.hysteresis={hysteresis} (zerompi halves the scale at every overflow: 1)")
        if auto_cast:
            unsupported.append("fp16.auto_cast=true (zerompi computes in the parameters' dtype)")
        put("--loss-scale", None if power is None else 2.0 ** power, "fp16.initial_scale_power")
        put("--loss-scale-window", window, "fp16.loss_scale_window")
        put("--min-loss-scale", min_scale, "fp16.min_loss_scale")

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
            put(flag, typed(params, "optimizer.params.", key, NUMBER, path), f"optimizer.params.{key}")
        betas = typed(params, "optimizer.params.", "betas", TWO_NUMBERS, path)
        if betas is not None:
            put("--beta1", betas[0], "optimizer.params.betas")
            put("--beta2", betas[1], "optimizer.params.betas")

    put("--clip-norm", typed(ds, "", "gradient_clipping", NUMBER, path), "gradient_clipping")
    put("--log-every", typed(ds, "", "steps_per_print", INTEGER, path), "steps_per_print")

    scheduler = typed(ds, "", "scheduler", OBJECT, path, {})
    leftovers("scheduler.", scheduler, {"type", "params"})
    schedule, ratio = _scheduler_flags(scheduler, unsupported, path) if scheduler else ({}, None)
    for flag, (value, key) in schedule.items():
        put(flag, value, key)
    if ratio is not None:                        # of the lr the run will have: the command line's first
        lr = command_line.lr if command_line.lr is not None else flags.get("--lr", command_line.default_lr)
        put("--min-lr", ratio * float(lr), "scheduler.params.cos_min_ratio")
    if "--dtype" in flags:
        keys["--dtype"] = "fp16.enabled" if flags["--dtype"] == "fp16" else "bf16.enabled"

    if unsupported:
        raise ConfigFileError(f"{path}: unsupported DeepSpeed settings: {', '.join(unsupported)}")
    return [flag if value is None else f"{flag}={value}" for flag, value in flags.items()], keys


def _enabled(section, name, path):
    """fp16's or bf16's (name) `enabled`: True, False (also where absent) or "auto" (the run's --dtype)."""
    if section.get("enabled") == "auto":
        return "auto"
    return typed(section, f"{name}.", "enabled", BOOLEAN, path, False)


def _scheduler_flags(scheduler, unsupported, path):
    """({flag: (value, key)}, cos_min_ratio or None) for WarmupLR and WarmupCosineLR with a linear
    warm-up from 0, zerompi's two schedules (deepspeed_flags makes the ratio --min-lr)."""
    kind = typed(scheduler, "scheduler.", "type", TEXT, path)
    params = typed(scheduler, "scheduler.", "params", OBJECT, path, {})
    mapped = {"WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
              "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                 "warmup_type"}}
    if kind not in mapped:
        unsupported.append(f"scheduler.type={kind!r} (WarmupLR or WarmupCosineLR)")
        return {}, None
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
    found = {"--lr-schedule": ("constant" if kind == "WarmupLR" else "cosine", "scheduler.type"),
             "--warmup-steps": (param("warmup_num_steps", INTEGER), "scheduler.params.warmup_num_steps")}
    if kind == "WarmupLR":
        found["--lr"] = (param("warmup_max_lr", NUMBER), "scheduler.params.warmup_max_lr")
    else:
        found["--steps"] = (param("total_num_steps", INTEGER), "scheduler.params.total_num_steps")
    ratio = param("cos_min_ratio", NUMBER) if kind == "WarmupCosineLR" else None
    return {flag: found[flag] for flag in found if found[flag][0] is not None}, ratio


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
