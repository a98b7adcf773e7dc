"""--config FILE.toml and DeepSpeed JSON configs (zerompi/train/options/config_files.py), parsed as on N ranks.

The end-to-end runs (one clear line, exit 2, nothing written) are in tests/proofs/test_cli.py's
bad-input table; here: what each file maps to, that the command line wins, and that every
unsupported key is named.
"""
import json
import os

import pytest

from test_cli import train_ok, load_weights
from zerompi.train.options.batch_rule import resolve_batch
from zerompi.train.options.before_mpi import choices_before_mpi
from zerompi.train.options.config import TrainConfig, parse_args
from zerompi.train.options.config_checks import check_config
from zerompi.train.options.errors import ArgumentError

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def write(folder, name, text):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text if isinstance(text, str) else json.dumps(text))
    return path


def error_of(argv, num_ranks=1):
    with pytest.raises(ArgumentError) as e:
        parse_args(argv, num_ranks=num_ranks)
    return str(e.value)


def test_example_toml_maps_every_key_and_the_command_line_wins():
    cfg = parse_args(["--config", os.path.join(EXAMPLES, "train.toml")], num_ranks=4)
    assert (cfg.stage, cfg.hidden, cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum, cfg.steps) == \
           (2, (128, 128), 128, 16, 2, 200)
    assert (cfg.lr, cfg.clip_norm, cfg.dtype, cfg.seed, cfg.log_every) == (3e-3, 1.0, "bf16", 1, 50)
    assert (cfg.check_collectives, cfg.collective_timeout) == (False, 300.0)
    cfg = parse_args(["--stage", "1", "--config", os.path.join(EXAMPLES, "train.toml"), "--check-collectives"])
    assert cfg.stage == 1 and cfg.check_collectives and cfg.grad_accum == 2


def test_toml_booleans_set_switches(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("shuffle = false\ncheck-collectives = true\noverlap = true\n")
    cfg = parse_args(["--config", str(toml)])
    assert cfg.shuffle is False and cfg.check_collectives is True and cfg.overlap is True
    toml.write_text("overlap = false\n")
    assert parse_args(["--config", str(toml)]).overlap is False


def test_example_deepspeed_config_maps_every_key():
    cfg = parse_args(["--config", os.path.join(EXAMPLES, "ds_config.json")], num_ranks=4)
    assert cfg.stage == 3 and cfg.dtype == "bf16"
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (16 * 2 * 4, 16, 2)   # micro x accum x N
    assert (cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay) == (0.003, 0.9, 0.999, 1e-8, 0.01)
    assert (cfg.clip_norm, cfg.lr_schedule, cfg.warmup_steps, cfg.steps) == (1.0, "cosine", 20, 200)
    assert cfg.min_lr == pytest.approx(0.1 * 0.003) and cfg.log_every == 50
    # each key is its flag's value and the command line wins per flag: the file's micro-batch of 16
    # with --grad-accum 1 on 2 ranks
    cfg = parse_args(["--deepspeed-config", os.path.join(EXAMPLES, "ds_config.json"), "--grad-accum", "1"],
                     num_ranks=2)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (32, 16, 1)


def test_deepspeed_batch_sizes_are_derived_like_deepspeed_and_checked(tmp_path):
    ds = write(tmp_path, "a.json", {"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8})
    cfg = parse_args(["--config", ds], num_ranks=3)
    assert (cfg.batch_size, cfg.grad_accum) == (96, 4)
    ds = write(tmp_path, "b.json", {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
                                    "gradient_accumulation_steps": 4})
    assert error_of(["--config", ds], num_ranks=3) == (
        "--batch-size 100, --micro-batch-size 8 and --grad-accum 4 disagree on 3 ranks: 8 x 4 x 3 = 96; "
        "use --batch-size 96, or give only two of the three")
    ds = write(tmp_path, "c.json", {"train_batch_size": 0})
    assert error_of(["--config", ds]) == f"{ds}: train_batch_size=0 must be a positive integer"


def test_deepspeed_fp16_and_warmup_lr(tmp_path):
    ds = write(tmp_path, "fp16.json", {
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                 "min_loss_scale": 2, "hysteresis": 1},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                     "warmup_num_steps": 7, "warmup_type": "linear"}}})
    cfg = parse_args(["--config", ds])
    assert (cfg.dtype, cfg.loss_scale, cfg.loss_scale_window, cfg.min_loss_scale) == ("fp16", 4096.0, 500, 2.0)
    assert (cfg.lr_schedule, cfg.lr, cfg.warmup_steps) == ("constant", 0.01, 7)


def test_every_unsupported_deepspeed_setting_is_named_in_one_message(tmp_path):
    ds = write(tmp_path, "ds.json", {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "tape"}, "overlap_comm": True},
        "fp16": {"enabled": True, "hysteresis": 2},
        "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3}},
        "wall_clock_breakdown": False})
    message = error_of(["--deepspeed-config", ds])
    assert message.startswith(f"{ds}: unsupported DeepSpeed settings: ")
    for name in ("zero_optimization.offload_optimizer.device='tape' (none, cpu or nvme)", "fp16.hysteresis=2", "optimizer.type='Lamb'",
                 "scheduler.params.warmup_type='log'"):
        assert name in message, (name, message)
    assert "wall_clock_breakdown" not in message and "overlap_comm" not in message     # accepted, mapped


def test_toml_unknown_keys_and_bad_values_name_the_file(tmp_path):
    toml = write(tmp_path, "a.toml", 'stage = 1\nbatchsize = 4\nlearning_rate = 0.1\n')
    assert error_of(["--config", toml]) == (f"{toml}: unknown keys: batchsize, learning_rate (the keys are "
                                             f"the long flag names without the dashes, see --help)")
    toml = write(tmp_path, "b.toml", 'lr = "fast"\n')
    assert error_of(["--config", toml]) == f"{toml}: lr='fast' must be a number"
    toml = write(tmp_path, "c.toml", 'stage = \n')
    assert error_of(["--config", toml]).startswith(f"{toml} is not valid TOML: ")


def test_a_toml_run_trains_exactly_what_the_same_flags_train(tmp_path):
    flags = ["--stage", "1", "--hidden", "7,5", "--batch-size", "12", "--steps", "3", "--data", "synthetic"]
    write(tmp_path, "run.toml", 'stage = 1\nhidden = [7, 5]\nbatch-size = 12\nsteps = 3\ndata = "synthetic"\n')
    common = ["--log-every", 0, "--report", "none"]
    train_ok(2, *flags, *common, "--save-weights", "flags.npz", cwd=tmp_path)
    train_ok(2, "--config", "run.toml", *common, "--save-weights", "file.npz", cwd=tmp_path)
    by_flags, by_file = load_weights(tmp_path / "flags.npz"), load_weights(tmp_path / "file.npz")
    assert all((by_flags[name] == by_file[name]).all() for name in by_flags)
    assert TrainConfig().stage != 1                 # the file really changed something


# ----------------------------------------------------------------------------------------------
# Files that are not regular files, nesting too deep, values of the wrong type
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, name", [("--config", "run.toml"), ("--config", "ds.json"),
                                        ("--deepspeed-config", "ds.json")])
def test_a_fifo_is_refused_without_blocking(tmp_path, no_hang, flag, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert error_of([flag, str(fifo)]) == f"cannot read config file {fifo}: is a FIFO (named pipe), not a regular file"
    assert choices_before_mpi(["--config", str(fifo)]).device == TrainConfig.device   # the peek before MPI starts


@pytest.mark.parametrize("flag, name", [("--config", "run.toml"), ("--deepspeed-config", "ds.json")])
def test_a_config_file_larger_than_a_megabyte_is_refused_before_it_is_read(tmp_path, no_hang, flag, name):
    """A 1 GB sparse TOML took a minute and 2 GB per rank before its error (a MemoryError
    traceback under a memory limit)."""
    big = tmp_path / name
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    assert error_of([flag, str(big)]) == f"cannot read config file {big}: larger than 1.0 MB, too large for a config file"
    assert choices_before_mpi(["--config", str(big)]).device == TrainConfig.device


@pytest.mark.parametrize("name, text", [("deep.json", "[" * 100_000 + "]" * 100_000),
                                        ("deep.json", '{"a": ' * 5000 + "1" + "}" * 5000),
                                        ("deep.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n"),
                                        ("deep.toml", "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n")])
def test_nesting_too_deep_is_one_line(tmp_path, name, text):
    path = write(tmp_path, name, text)
    message = error_of(["--config", path])
    assert message.startswith(f"{path} is not valid {'JSON' if name.endswith('json') else 'TOML'}: nested too deeply")


@pytest.mark.parametrize("ds, named", [
    ({"fp16": {"enabled": "false"}}, "fp16.enabled='false' must be true or false"),
    ({"bf16": {"enabled": 1}}, "bf16.enabled=1 must be true or false"),
    ({"fp16": {"enabled": True, "initial_scale_power": 1e6}}, "fp16.initial_scale_power=1000000.0 must be an integer"),
    ({"fp16": {"enabled": True, "initial_scale_power": "16"}}, "fp16.initial_scale_power='16' must be an integer"),
    ({"fp16": {"enabled": True, "initial_scale_power": 1000000}}, "fp16.initial_scale_power=1000000 must be an integer"
                                                                  " from 0 to 127 (the initial loss scale is 2^power)"),
    ({"fp16": {"enabled": True, "loss_scale_window": 2.5}}, "fp16.loss_scale_window=2.5 must be an integer"),
    ({"fp16": {"enabled": True, "min_loss_scale": "1"}}, "fp16.min_loss_scale='1' must be a number"),
    ({"fp16": {"enabled": True, "loss_scale": None}}, "fp16.loss_scale=None must be a number"),
    ({"fp16": {"enabled": True, "hysteresis": "2"}}, "fp16.hysteresis='2' must be an integer"),
    ({"optimizer": {"type": "AdamW", "params": [0.1, 0.9]}}, "optimizer.params=[0.1, 0.9] must be an object"),
    ({"optimizer": {"type": ["AdamW"]}}, "optimizer.type=['AdamW'] must be a string"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "1e-3"}}}, "optimizer.params.lr='1e-3' must be a number"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": True}}}, "optimizer.params.lr=True must be a number"),
    ({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, "0.99"]}}},
     "optimizer.params.betas=[0.9, '0.99'] must be a list of two numbers"),
    ({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": "true"}}},
     "optimizer.params.adam_w_mode='true' must be true or false"),
    ({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_type": "linear", "cos_min_ratio": "0.1"}}},
     "scheduler.params.cos_min_ratio='0.1' must be a number"),
    ({"scheduler": {"type": ["WarmupLR"]}}, "scheduler.type=['WarmupLR'] must be a string"),
    ({"scheduler": {"type": "WarmupLR", "params": "fast"}}, "scheduler.params='fast' must be an object"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear", "warmup_num_steps": 7.5}}},
     "scheduler.params.warmup_num_steps=7.5 must be an integer"),
    ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage='2' must be an integer"),
    ({"gradient_clipping": "1.0"}, "gradient_clipping='1.0' must be a number"),
    ({"steps_per_print": True}, "steps_per_print=True must be an integer"),
    ({"train_batch_size": "64"}, "train_batch_size='64' must be an integer"),
])
def test_deepspeed_values_of_the_wrong_type_are_one_line(tmp_path, ds, named):
    path = write(tmp_path, "ds.json", ds)
    assert error_of(["--deepspeed-config", path]) == f"{path}: {named}"


AUTO_KEYS = [("train_batch_size",), ("train_micro_batch_size_per_gpu",), ("gradient_accumulation_steps",),
             ("gradient_clipping",), ("fp16", "enabled"), ("bf16", "enabled"), ("optimizer", "params", "lr"),
             ("optimizer", "params", "betas"), ("optimizer", "params", "eps"), ("optimizer", "params", "weight_decay"),
             ("scheduler", "params", "warmup_min_lr"), ("scheduler", "params", "warmup_max_lr"),
             ("scheduler", "params", "warmup_num_steps"), ("scheduler", "params", "total_num_steps")]


@pytest.mark.parametrize("key", AUTO_KEYS, ids=".".join)
def test_auto_is_what_the_command_line_or_the_default_says(tmp_path, key):
    """"auto" reads as if the key were absent: the run has the flags' defaults (the batch: the
    default micro-batch), and the command line's values where it gives them."""
    ds = {"optimizer": {"type": "AdamW", "params": {}},
          "scheduler": {"type": "WarmupLR" if key[-1] != "total_num_steps" else "WarmupCosineLR",
                        "params": {"warmup_type": "linear"}}}
    table = ds
    for part in key[:-1]:
        table = table.setdefault(part, {})
    table[key[-1]] = "auto"
    path = write(tmp_path, "ds.json", ds)
    cfg = parse_args(["--deepspeed-config", path], num_ranks=3)
    default = TrainConfig()
    for name in ("dtype", "clip_norm", "lr", "beta1", "beta2", "eps", "weight_decay", "warmup_steps"):
        assert getattr(cfg, name) == getattr(default, name), name
    assert cfg.steps == default.steps and (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (48, 16, 1)
    given = ["--dtype", "bf16", "--clip-norm", "0.5", "--lr", "0.01", "--beta1", "0.8", "--eps", "1e-6",
             "--weight-decay", "0", "--warmup-steps", "3", "--steps", "40", "--batch-size", "12", "--grad-accum", "2"]
    cfg = parse_args(["--deepspeed-config", path, *given], num_ranks=3)
    assert (cfg.dtype, cfg.clip_norm, cfg.lr, cfg.beta1, cfg.eps, cfg.weight_decay, cfg.warmup_steps, cfg.steps) == \
           ("bf16", 0.5, 0.01, 0.8, 1e-6, 0.0, 3, 40)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (12, 2, 2)


def test_fp16_enabled_auto_follows_dtype_and_then_its_loss_scale_keys_apply(tmp_path):
    path = write(tmp_path, "ds.json", {"fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 10,
                                                "loss_scale_window": 300, "hysteresis": 1, "min_loss_scale": 2}})
    cfg = parse_args(["--deepspeed-config", path])
    assert cfg.dtype == "float32" and cfg.loss_scale == TrainConfig.loss_scale       # fp16 off: not read
    cfg = parse_args(["--deepspeed-config", path, "--dtype", "fp16"])
    assert (cfg.dtype, cfg.loss_scale, cfg.loss_scale_window, cfg.min_loss_scale) == ("fp16", 1024.0, 300, 2.0)
    path = write(tmp_path, "hysteresis.json", {"fp16": {"enabled": "auto", "hysteresis": 2}})
    assert parse_args(["--deepspeed-config", path]).dtype == "float32"
    assert error_of(["--deepspeed-config", path, "--dtype", "fp16"]) == (
        f"{path}: unsupported DeepSpeed settings: fp16.hysteresis=2 (zerompi halves the scale at every overflow: 1)")


def test_a_cosine_floor_is_a_ratio_of_the_lr_the_run_has(tmp_path):
    path = write(tmp_path, "ds.json", {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                                       "scheduler": {"type": "WarmupCosineLR", "params": {
                                           "warmup_type": "linear", "cos_min_ratio": 0.1}}})
    assert parse_args(["--deepspeed-config", path]).min_lr == pytest.approx(0.1 * TrainConfig.lr)
    assert parse_args(["--deepspeed-config", path, "--lr", "0.02"]).min_lr == pytest.approx(0.002)


@pytest.mark.parametrize("ds, named", [
    ({"zero_optimization": {"stage": "auto"}}, "zero_optimization.stage"),
    ({"optimizer": {"type": "auto"}}, "optimizer.type"),
    ({"fp16": {"enabled": True, "loss_scale_window": "auto"}}, "fp16.loss_scale_window"),
    ({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_type": "linear", "cos_min_ratio": "auto"}}},
     "scheduler.params.cos_min_ratio"),
])
def test_auto_that_nothing_decides_is_one_line_naming_the_key(tmp_path, ds, named):
    path = write(tmp_path, "ds.json", ds)
    assert error_of(["--deepspeed-config", path]) == (f'{path}: {named} is "auto", which neither the command line '
                                                      f'nor the data decides in zerompi: give a value')


def test_a_toml_switch_needs_a_boolean(tmp_path):
    toml = write(tmp_path, "run.toml", 'shuffle = "false"\n')
    assert error_of(["--config", toml]) == f"{toml}: shuffle='false' must be true or false"


@pytest.mark.parametrize("line, says", [
    ('resume = true', "resume=True must be a string"),                      # read as the path "True"
    ('metrics = ["a", "b"]', "metrics=['a', 'b'] must be a string"),         # wrote a file named "a,b"
    ('save-dir = 5', "save-dir=5 must be a string"),
    ('steps = "4"', "steps='4' must be an integer"),
    ('steps = 4.0', "steps=4.0 must be an integer"),
    ('steps = true', "steps=True must be an integer"),
    ('lr = "0.1"', "lr='0.1' must be a number"),
    ('hidden = 64', "hidden=64 must be a list of integers"),
    ('hidden = [64, "a"]', "hidden=[64, 'a'] must be a list of integers"),
])
def test_a_toml_value_must_have_its_flags_type(tmp_path, line, says):
    toml = write(tmp_path, "run.toml", line + "\n")
    assert error_of(["--config", toml]) == f"{toml}: {says}"


def test_toml_values_of_the_right_type_are_read(tmp_path):
    toml = write(tmp_path, "run.toml", 'steps = 0x10\nlr = 1\nhidden = [16, 8]\nresume = "latest"\n'
                                       'save-dir = "ck"\n')
    cfg = parse_args(["--config", toml])
    assert (cfg.steps, cfg.lr, cfg.hidden, cfg.resume, cfg.save_dir) == (16, 1.0, (16, 8), "latest", "ck")


def test_a_key_with_a_line_break_is_named_on_one_line(tmp_path):
    path = write(tmp_path, "ds.json", {"bad\nkey": 1})
    message = error_of(["--deepspeed-config", path])
    assert "\n" not in message and "'bad\\nkey'" in message


# ----------------------------------------------------------------------------------------------
# The batch sizes: one rule (zerompi/train/options/batch_rule.py's resolve_batch) for flags, TOML and DeepSpeed
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 17))
def test_no_batch_option_gives_16_rows_per_rank_on_any_n(n):
    cfg = parse_args([], num_ranks=n)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (16 * n, 16, 1)
    assert cfg.batch_size <= 1497              # the shipped digits' training rows (BatchSchedule's limit)


@pytest.mark.parametrize("flags, n, resolved", [
    (["--batch-size", "48"], 3, (48, 16, 1)),                                   # only the global batch
    (["--micro-batch-size", "5"], 3, (15, 5, 1)),                               # only the micro-batch
    (["--grad-accum", "3"], 2, (96, 16, 3)),                                    # only the accumulation
    (["--batch-size", "48", "--grad-accum", "2"], 3, (48, 8, 2)),               # global and accumulation
    (["--batch-size", "48", "--micro-batch-size", "4"], 3, (48, 4, 4)),         # global and micro-batch
    (["--micro-batch-size", "4", "--grad-accum", "3"], 5, (60, 4, 3)),          # micro-batch and accumulation
    (["--batch-size", "60", "--micro-batch-size", "4", "--grad-accum", "3"], 5, (60, 4, 3)),   # all three agree
])
def test_any_two_batch_options_decide_the_third(flags, n, resolved):
    cfg = parse_args(flags, num_ranks=n)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == resolved


def test_the_global_batch_given_is_kept_on_every_n():
    """What makes results independent of N: only the per-rank rows change."""
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 48):
        cfg = parse_args(["--batch-size", "48"], num_ranks=n)
        assert (cfg.batch_size, cfg.micro_batch_size * n, cfg.grad_accum) == (48, 48, 1)


@pytest.mark.parametrize("flags, n, message", [
    (["--batch-size", "128"], 6, "--batch-size 128 cannot be split over 6 ranks x 1 micro-batch: use --batch-size "
                                 "126 or 132, or --micro-batch-size 21 instead (a global batch of 126)"),
    (["--batch-size", "120", "--grad-accum", "2"], 8, "--batch-size 120 cannot be split over 8 ranks x 2 "
     "micro-batches: use --batch-size 112 or 128, or --grad-accum 1 or 3"),
    (["--batch-size", "4"], 8, "--batch-size 4 cannot be split over 8 ranks x 1 micro-batch: use --batch-size 8"),
    (["--batch-size", "96", "--micro-batch-size", "5"], 3, "--batch-size 96 is no whole number of micro-batches "
     "of 5 rows on 3 ranks: use --batch-size 90 or 105, or --micro-batch-size 4 or 8"),
    (["--batch-size", "100", "--micro-batch-size", "8"], 3, "--batch-size 100 is no whole number of micro-batches "
     "of 8 rows on 3 ranks: use --batch-size 96 or 120"),
    (["--batch-size", "100", "--micro-batch-size", "8", "--grad-accum", "4"], 3, "--batch-size 100, "
     "--micro-batch-size 8 and --grad-accum 4 disagree on 3 ranks: 8 x 4 x 3 = 96; use --batch-size 96, or give "
     "only two of the three"),
    (["--micro-batch-size", "0"], 2, "--micro-batch-size must be positive, got 0"),
    (["--grad-accum", "-1"], 2, "--grad-accum must be positive, got -1"),
])
def test_an_impossible_combination_names_the_nearest_valid_values(flags, n, message):
    assert error_of(flags, num_ranks=n) == message


def test_every_suggested_value_is_valid():
    """Every value an error suggests resolves on the same N: a --batch-size with the given
    --grad-accum, a --grad-accum with the given --batch-size, a --micro-batch-size alone."""
    for G in range(1, 200):
        for n in (3, 6, 7, 8):
            for M in (None, 2, 3):
                try:
                    resolve_batch(G, None, M, n)
                    continue
                except ArgumentError as e:
                    suggestions = str(e).split(": use ")[1].split(", or ")
                for suggestion in suggestions:
                    flag, values = suggestion.split(" instead (")[0].split(" ", 1)
                    for value in map(int, values.split(" or ")):
                        given = {"--batch-size": (value, None, M), "--grad-accum": (G, None, value),
                                 "--micro-batch-size": (None, value, None)}[flag]
                        resolve_batch(*given, n)                  # raises if the suggestion is wrong


def test_a_toml_and_a_deepspeed_file_go_through_the_same_rule(tmp_path):
    toml = write(tmp_path, "run.toml", "micro-batch-size = 4\ngrad-accum = 2\n")
    ds = write(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})
    for path in (toml, ds):
        cfg = parse_args(["--config", path], num_ranks=3)
        assert (cfg.batch_size, cfg.micro_batch_size, cfg.grad_accum) == (24, 4, 2)
        assert error_of(["--config", path, "--batch-size", "12"], num_ranks=3).startswith(
            "--batch-size 12, --micro-batch-size 4 and --grad-accum 2 disagree on 3 ranks")


# ----------------------------------------------------------------------------------------------
# DeepSpeed configs as published: the ZeRO-1/2/3 examples of DeepSpeed's and Hugging Face's
# documentation, keys and values copied as they are there
# ----------------------------------------------------------------------------------------------

# https://www.deepspeed.ai/tutorials/zero/ ("Training a 1.5B Parameter GPT-2 model")
DEEPSPEED_TUTORIAL_ZERO1 = {"zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}}
# https://www.deepspeed.ai/tutorials/zero/ ("Training a 10B Parameter GPT-2 model")
DEEPSPEED_TUTORIAL_ZERO2 = {"zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                                                  "reduce_scatter": True, "reduce_bucket_size": 5e8,
                                                  "allgather_bucket_size": 5e8}}
# https://www.deepspeed.ai/tutorials/zero/ ("Offloading to CPU and NVMe with ZeRO-Infinity")
DEEPSPEED_TUTORIAL_ZERO3_OFFLOAD = {"zero_optimization": {
    "stage": 3, "contiguous_gradients": True, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_prefetch_bucket_size": 1e7, "stage3_param_persistence_threshold": 1e5, "reduce_bucket_size": 1e7,
    "sub_group_size": 1e9, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
# https://huggingface.co/docs/transformers/deepspeed ("ZeRO-1")
TRANSFORMERS_DOCS_ZERO1 = {"zero_optimization": {"stage": 1}}
# https://github.com/huggingface/transformers/blob/main/tests/deepspeed/ds_config_zero2.json (the ZeRO-2
# config the Transformers DeepSpeed docs run)
TRANSFORMERS_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
# https://huggingface.co/docs/transformers/deepspeed ("NVMe configuration": the ZeRO-3 config with "auto")
TRANSFORMERS_DOCS_ZERO3_NVME = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 4,
                              "fast_init": False},
        "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 5,
                          "buffer_size": 1e8, "max_in_cpu": 1e9},
        "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
# https://github.com/huggingface/transformers/blob/main/tests/deepspeed/ds_config_zero3.json (an older version:
# fixed values, the old name stage3_gather_fp16_weights_on_model_save)
TRANSFORMERS_ZERO3 = {
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e14, "reduce_bucket_size": 0,
                          "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_fp16_weights_on_model_save": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500}},
    "steps_per_print": 2000, "wall_clock_breakdown": False}


def _without_offload(ds):
    """The same config with DeepSpeed's "no offload" device, "none", in each offload section, and a
    linear warm-up where the scheduler leaves DeepSpeed's default, a logarithmic one (zerompi warms
    up linearly: the file as published is refused naming both, below)."""
    ds = json.loads(json.dumps(ds))
    for key in ("offload_optimizer", "offload_param"):
        if key in ds["zero_optimization"]:
            ds["zero_optimization"][key]["device"] = "none"
    if "scheduler" in ds:
        ds["scheduler"]["params"].setdefault("warmup_type", "linear")
    return ds


DEFAULTS = TrainConfig()


@pytest.mark.parametrize("ds, extra, expected", [
    (DEEPSPEED_TUTORIAL_ZERO1, [], dict(stage=1, overlap=False)),
    (DEEPSPEED_TUTORIAL_ZERO2, [], dict(stage=2, overlap=True)),
    (_without_offload(DEEPSPEED_TUTORIAL_ZERO3_OFFLOAD), [], dict(stage=3, overlap=False)),
    (TRANSFORMERS_DOCS_ZERO1, [], dict(stage=1)),
    # "auto" everywhere: the flags' values; steps_per_print: --log-every; WarmupLR: the constant schedule
    (_without_offload(TRANSFORMERS_ZERO2), [], dict(stage=2, overlap=True, dtype="float32", lr=DEFAULTS.lr,
                                                   beta1=DEFAULTS.beta1, eps=DEFAULTS.eps, clip_norm=0.0,
                                                   warmup_steps=DEFAULTS.warmup_steps, lr_schedule="constant",
                                                   log_every=2000, batch_size=16 * 4, grad_accum=1)),
    (_without_offload(TRANSFORMERS_ZERO2), ["--dtype", "bf16", "--lr", "0.01", "--batch-size", "32"],
     dict(dtype="bf16", lr=0.01, batch_size=32, micro_batch_size=8)),
    (_without_offload(TRANSFORMERS_DOCS_ZERO3_NVME), ["--warmup-steps", "5"],
     dict(stage=3, overlap=True, lr_schedule="constant", warmup_steps=5, log_every=2000)),
    # fixed values; hysteresis 2 is refused only when the run is fp16 (below)
    (_without_offload(TRANSFORMERS_ZERO3), ["--dtype", "bf16"],
     dict(stage=3, overlap=True, dtype="bf16", lr=3e-5, beta1=0.8, beta2=0.999, eps=1e-8, weight_decay=3e-7,
          lr_schedule="constant", warmup_steps=500, log_every=2000)),
], ids=["deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3-offload-none", "transformers-zero1",
        "transformers-zero2-auto", "transformers-zero2-auto-flags", "transformers-zero3-nvme-auto",
        "transformers-zero3"])
def test_published_deepspeed_configs_load_to_the_flags_they_mean(tmp_path, ds, extra, expected):
    path = write(tmp_path, "ds.json", ds)
    cfg = parse_args(["--deepspeed-config", path, *extra], num_ranks=4)
    assert {name: getattr(cfg, name) for name in expected} == expected


WARMUP_LOG = (", scheduler.params.warmup_type='log' (DeepSpeed's default is 'log'; zerompi warms up linearly: "
              "set 'linear')")


@pytest.mark.parametrize("ds, refused", [
    (TRANSFORMERS_ZERO2, WARMUP_LOG[2:]),
    (TRANSFORMERS_DOCS_ZERO3_NVME, WARMUP_LOG[2:]),
    (TRANSFORMERS_ZERO3, "fp16.hysteresis=2 (zerompi halves the scale at every overflow: 1)" + WARMUP_LOG),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": False}}},
     "zero_optimization.offload_optimizer.pin_memory=false (zerompi always pins and pipelines its tiers)"),
    ({"zero_optimization": {"offload_param": {"device": "cpu", "max_in_gpu": 1}}},
     "zero_optimization.offload_param.max_in_gpu"),
    ({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "a"},
                            "offload_param": {"device": "nvme", "nvme_path": "b"}}},
     "zero_optimization.offload_param.nvme_path='b' (zerompi has one --offload-dir for both)"),
], ids=["transformers-zero2", "transformers-zero3-nvme", "transformers-zero3", "unpinned", "param-key",
        "two-nvme-paths"])
def test_published_configs_that_offload_what_zerompi_cannot_are_refused_naming_the_keys(tmp_path, ds, refused):
    path = write(tmp_path, "ds.json", ds)
    assert error_of(["--deepspeed-config", path]) == f"{path}: unsupported DeepSpeed settings: {refused}"


@pytest.mark.parametrize("offload, expected", [
    ({"device": "cpu", "pin_memory": True}, dict(offload_optimizer="host", offload_dir="")),
    ({"device": "nvme", "nvme_path": "NVME", "pin_memory": True, "fast_init": False, "buffer_count": 4},
     dict(offload_optimizer="file", offload_dir="NVME")),
    ({"device": "none", "nvme_path": "ignored"}, dict(offload_optimizer="none", offload_dir="")),
])
@pytest.mark.parametrize("section", ["offload_optimizer", "offload_param"])
def test_deepspeed_offload_maps_onto_the_offload_flags(tmp_path, section, offload, expected):
    """offload_optimizer onto --offload-optimizer, offload_param onto --offload-params (at stage 3,
    beside an optimizer offloaded to the host, as --offload-params needs)."""
    if offload["device"] == "nvme":                        # a folder of its own, holding no input
        (tmp_path / "nvme").mkdir()
        offload = dict(offload, nvme_path=str(tmp_path / "nvme"))
        expected = dict(expected, offload_dir=str(tmp_path / "nvme"))
    if section == "offload_param":
        offload = {k: v for k, v in offload.items() if k not in ("fast_init",)}
        expected = {("offload_params" if k == "offload_optimizer" else k): v for k, v in expected.items()}
        zero = {"stage": 3, "offload_param": offload, "offload_optimizer": {"device": "cpu"}}
    else:
        zero = {"stage": 2, "offload_optimizer": offload}
    ds = dict(_without_offload(TRANSFORMERS_ZERO2), zero_optimization=zero)
    cfg = parse_args(["--deepspeed-config", write(tmp_path, "ds.json", ds)], num_ranks=4)
    assert {name: getattr(cfg, name) for name in expected} == expected


def test_published_zero_infinity_configs_map_both_offloads(tmp_path):
    """DeepSpeed's ZeRO-Infinity tutorial and Transformers' NVMe example, as published (their
    scheduler made linear, overlap_comm off: --offload-params has no --overlap): the optimizer and the
    parameters offloaded as they say."""
    cfg = parse_args(["--deepspeed-config", write(tmp_path, "a.json", DEEPSPEED_TUTORIAL_ZERO3_OFFLOAD)], num_ranks=4)
    assert (cfg.stage, cfg.offload_optimizer, cfg.offload_params) == (3, "host", "host")
    (tmp_path / "nvme").mkdir()
    nvme = json.loads(json.dumps(TRANSFORMERS_DOCS_ZERO3_NVME).replace("/local_nvme", str(tmp_path / "nvme")))
    nvme["scheduler"]["params"]["warmup_type"] = "linear"
    nvme["zero_optimization"]["overlap_comm"] = False
    cfg = parse_args(["--deepspeed-config", write(tmp_path, "b.json", nvme), "--warmup-steps", "5"], num_ranks=4)
    assert (cfg.offload_optimizer, cfg.offload_params, cfg.offload_dir) == ("file", "file", str(tmp_path / "nvme"))


@pytest.mark.parametrize("ds, refused", [
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage=4 (0, 1, 2 or 3)"),
    ({"scheduler": {"type": "WarmupDecayLR", "params": {}}}, "scheduler.type='WarmupDecayLR' (WarmupLR or "
                                                             "WarmupCosineLR)"),
    ({"fp16": {"enabled": True, "auto_cast": True}}, "fp16.auto_cast=true (zerompi computes in the parameters' "
                                                     "dtype)"),
    ({"zero_optimization": {"zero_quantized_weights": True}}, "zero_optimization.zero_quantized_weights"),
    ({"amp": {"enabled": True}}, "amp"),
])
def test_what_zerompi_does_not_implement_is_refused_naming_it(tmp_path, ds, refused):
    path = write(tmp_path, "ds.json", ds)
    assert error_of(["--deepspeed-config", path]) == f"{path}: unsupported DeepSpeed settings: {refused}"


def test_keys_that_change_nothing_in_the_math_are_accepted(tmp_path):
    path = write(tmp_path, "ds.json", {
        "wall_clock_breakdown": True, "flops_profiler": {"enabled": True}, "timers": {}, "comms_logger": {},
        "memory_breakdown": False, "dump_state": False, "tensorboard": {"enabled": True}, "wandb": {},
        "csv_monitor": {}, "comet": {}, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "round_robin_gradients": True,
                              "elastic_checkpoint": True, "load_from_fp32_weights": True,
                              "offload_optimizer": {"device": "none", "pin_memory": True}}})
    cfg = parse_args(["--deepspeed-config", path, "--overlap"])
    assert cfg.stage == 2 and cfg.overlap is True                         # the command line wins
    assert parse_args(["--deepspeed-config", path]).overlap is False


@pytest.mark.timeout(10)
@pytest.mark.parametrize("global_batch, micro, accumulation", [(10 ** 10, None, 7), (2 * 10 ** 12, 3, None),
                                                               (2 ** 61 - 2, None, 2)])
def test_a_huge_batch_that_does_not_split_is_refused_at_once(global_batch, micro, accumulation):
    """The nearest valid values are found without trying every divisor of a huge batch (a typo
    must not hang every rank before the error)."""
    with pytest.raises(ArgumentError, match=f"--batch-size {global_batch}"):
        resolve_batch(global_batch, micro, accumulation, 2)


def test_the_fp16_section_is_checked_whenever_the_run_is_fp16_and_its_keys_always(tmp_path):
    """fp16.enabled false in the file, --dtype fp16 on the command line: the run is fp16, so the
    section's loss-scale settings are the run's (hysteresis 2 is refused, the window is taken);
    a key zerompi does not know is refused whatever the dtype."""
    off = write(tmp_path, "off.json", {"fp16": {"enabled": False, "hysteresis": 2}})
    assert "fp16.hysteresis=2" in error_of(["--deepspeed-config", off, "--dtype", "fp16"])
    assert parse_args(["--deepspeed-config", off]).dtype == "float32"          # not fp16: nothing to apply
    window = write(tmp_path, "window.json", {"fp16": {"enabled": False, "loss_scale_window": 50}})
    assert parse_args(["--deepspeed-config", window, "--dtype", "fp16"]).loss_scale_window == 50
    unknown = write(tmp_path, "unknown.json", {"fp16": {"enabled": False, "bogus": 1}})
    assert "fp16.bogus" in error_of(["--deepspeed-config", unknown])


def test_deepspeed_mics_and_hpz_map_to_the_hierarchical_flags(tmp_path):
    """MiCS's shard size is --shard-group (-1: off); an hpZ partition size > 1 is --hpz (1: off)."""
    ds = write(tmp_path, "mics.json", {"zero_optimization": {"stage": 3, "mics_shard_size": 4}})
    cfg = parse_args(["--config", ds], num_ranks=8)
    assert (cfg.shard_group, cfg.hpz) == ("4", False)
    ds = write(tmp_path, "hpz.json", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8,
                                                            "mics_shard_size": -1}})
    cfg = parse_args(["--config", ds], num_ranks=8)
    assert (cfg.shard_group, cfg.hpz) == ("world", True)
    ds = write(tmp_path, "off.json", {"zero_optimization": {"zero_hpz_partition_size": 1}})
    assert parse_args(["--config", ds]).hpz is False
    ds = write(tmp_path, "bad.json", {"zero_optimization": {"mics_shard_size": "4"}})
    assert "mics_shard_size" in error_of(["--config", ds])


# ----------------------------------------------------------------------------------------------
# Values that begin with "-", and errors that name the file's key
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, named", [
    ("run.toml", "lr = -1e-3\n", "run.toml: lr: --lr must be positive, got -0.001"),
    ("run.toml", "clip-norm = -inf\n", "run.toml: clip-norm: --clip-norm must be a finite number, got -inf"),
    ("ds.json", {"optimizer": {"type": "AdamW", "params": {"lr": -1e-3}}},
     "ds.json: optimizer.params.lr: --lr must be positive, got -0.001"),
    ("ds.json", {"gradient_clipping": -1}, "ds.json: gradient_clipping: --clip-norm must be >= 0 (0: off), got -1.0"),
    ("ds.json", {"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}},
     "ds.json: optimizer.params.betas: --beta1 and --beta2 must be in [0, 1), got 0.9 and 1.5"),
])
def test_a_bad_value_from_a_file_is_named_by_its_key_and_values_may_begin_with_a_dash(tmp_path, name, text, named):
    """A value beginning with "-" from a file (-1e-3, -inf, a file named -x.npz) gave argparse's
    "expected one argument"; one that parsed but was refused named the flag, not the file's key."""
    path = write(tmp_path, name, text)
    flag = "--deepspeed-config" if name.endswith(".json") else "--config"
    assert error_of([flag, path]) == named.replace(name, path, 1)


def test_dash_values_from_a_file_and_the_command_line_are_values(tmp_path):
    path = write(tmp_path, "run.toml", 'data = "-x.npz"\nsave-weights = "-w.npz"\n')
    cfg = parse_args(["--config", path])
    assert (cfg.data, cfg.save_weights) == ("-x.npz", "-w.npz")
    cfg = parse_args(["--lr", "-1e-3", "--data", "-y.npz", "--hidden", "-4"][:4])
    assert (cfg.lr, cfg.data) == (-1e-3, "-y.npz")
    assert check_config(cfg, 1) == "--lr must be positive, got -0.001"
    assert "widths must be positive" in error_of(["--hidden", "-4"])
    assert "expected one argument" in error_of(["--save-dir", "--resume"])      # a flag, not a value


def test_a_bad_value_given_on_the_command_line_over_a_file_names_the_flag(tmp_path):
    path = write(tmp_path, "run.toml", "lr = 0.01\n")
    cfg = parse_args(["--config", path, "--lr", "-1"])
    assert check_config(cfg, 1) == "--lr must be positive, got -1.0"


def test_an_fp16_loss_scale_from_a_file_is_named_by_its_key(tmp_path):
    path = write(tmp_path, "run.toml", 'dtype = "fp16"\nloss-scale = 2\nmin-loss-scale = 4\n')
    assert error_of(["--config", path]) == f"{path}: min-loss-scale: --min-loss-scale 4 is above --loss-scale 2: " \
                                           f"the run would stop at its first overflow"
