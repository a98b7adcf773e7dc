"""--config FILE.toml and DeepSpeed JSON configs (zerompi/train/config_files.py), parsed as on N ranks.

The end-to-end runs (one clear line, exit 2, nothing written) are in tests/test_cli.py's
bad-input table; here: what each file maps to, that the command line wins, and that every
unsupported key is named.
"""
import json
import os

import pytest

from test_cli import train_ok, load_weights
from zerompi.train.config import ArgumentError, TrainConfig, device_choice, parse_args

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


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
    cfg = parse_args(["--config", os.path.join(EXAMPLES, "train.toml")])
    assert (cfg.stage, cfg.hidden, cfg.batch_size, cfg.grad_accum, cfg.steps) == (2, (128, 128), 128, 2, 200)
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
    assert (cfg.batch_size, cfg.grad_accum) == (16 * 2 * 4, 2)          # micro x accumulation x N
    assert (cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay) == (0.003, 0.9, 0.999, 1e-8, 0.01)
    assert (cfg.clip_norm, cfg.lr_schedule, cfg.warmup_steps, cfg.steps) == (1.0, "cosine", 20, 200)
    assert cfg.min_lr == pytest.approx(0.1 * 0.003) and cfg.log_every == 50
    assert parse_args(["--deepspeed-config", os.path.join(EXAMPLES, "ds_config.json"), "--grad-accum", "1"],
                      num_ranks=2).batch_size == 64                   # N = 2; the flag wins


def test_deepspeed_batch_sizes_are_derived_like_deepspeed_and_checked(tmp_path):
    ds = write(tmp_path, "a.json", {"train_batch_size": 96, "train_micro_batch_size_per_gpu": 8})
    cfg = parse_args(["--config", ds], num_ranks=3)
    assert (cfg.batch_size, cfg.grad_accum) == (96, 4)
    ds = write(tmp_path, "b.json", {"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
                                    "gradient_accumulation_steps": 4})
    message = error_of(["--config", ds], num_ranks=3)
    assert "inconsistent batch sizes: train_batch_size 100 != train_micro_batch_size_per_gpu 8 x " \
           "gradient_accumulation_steps 4 x 3 ranks = 96" in message


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
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True},
        "fp16": {"enabled": True, "hysteresis": 2},
        "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3}},
        "wall_clock_breakdown": False})
    message = error_of(["--deepspeed-config", ds])
    assert message.startswith(f"{ds}: unsupported DeepSpeed settings: ")
    for name in ("wall_clock_breakdown", "zero_optimization.offload_optimizer", "zero_optimization.overlap_comm",
                 "fp16.hysteresis=2", "optimizer.type='Lamb'", "scheduler.params.warmup_type='log'"):
        assert name in message, (name, message)


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
    assert device_choice(["--config", str(fifo)]) == TrainConfig.device     # the peek before MPI starts


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
def test_auto_is_refused_with_a_line_saying_zerompi_does_not_resolve_it(tmp_path, key):
    ds = {"optimizer": {"type": "AdamW", "params": {}},
          "scheduler": {"type": "WarmupLR" if key[-1] != "total_num_steps" else "WarmupCosineLR",
                        "params": {"warmup_type": "linear"}}}
    table = ds
    for part in key[:-1]:
        table = table.setdefault(part, {})
    table[key[-1]] = "auto"
    path = write(tmp_path, "ds.json", ds)
    assert error_of(["--deepspeed-config", path]) == (f'{path}: {".".join(key)} is "auto": zerompi does not resolve '
                                                      f'"auto" yet; give a value')


def test_auto_where_deepspeed_does_not_take_it_is_a_wrong_type(tmp_path):
    path = write(tmp_path, "ds.json", {"zero_optimization": {"stage": "auto"}})
    assert error_of(["--deepspeed-config", path]) == f"{path}: zero_optimization.stage='auto' must be an integer"


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
