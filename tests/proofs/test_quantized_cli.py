"""`--quantize-weights int8` (qwZ) and `--quantize-grads int8` (qgZ, zerompi/quantize/) from the command
line: the default digits still train past 95% held out with either and both, flat and with hpZ (full
ZeRO++), and the report's scales equal their formula; refused with one line where they do not exist;
checkpoints keep the exact weights (quantization lives on the wire only), so a quantized run resumes
bit for bit, and resumes unquantized, at another N and stage, and the other way round."""
import json
import re

import numpy as np
import pytest

from test_cli import ERROR_MARK, launch, load_weights, train_ok
from zerompi.util.exit_codes import ExitCode

QWZ = ("--quantize-weights", "int8")
QGZ = ("--quantize-grads", "int8")
FLAGS = ("--hidden", "48,48", "--batch-size", "24", "--report", "none")


@pytest.mark.parametrize("n, flags", [(2, QWZ), (4, (*QWZ, "--hpz", "--dtype", "bf16", "--quant-block", "256")),
                                     (3, (*QGZ, "--stage", "2")),
                                     (4, (*QWZ, "--quantize-grads", "int4", "--hpz", "--quant-block", "256"))],
                         ids=["qwz", "qwz-hpz-bf16", "qgz-stage2", "zeropp-int4"])
def test_the_default_digits_train_past_95_percent_and_the_scales_are_their_formula(tmp_path, n, flags):
    """Scales per step: 4 (N-1) ceil(n_u / B) bytes per quantized call on layer u (n_u its shard): 2
    gathers a step flat, 1 with hpZ, and 1 reduction; in the report and in every --metrics record.
    Each rank's counted words per step are the report's formula at Psi_pad (int4: packed bytes)."""
    run = train_ok(n, *flags, "--metrics", tmp_path / "m.jsonl", cwd=tmp_path)
    accuracy = float(re.search(r"held-out accuracy ([\d.]+)%", run.output).group(1))
    assert accuracy >= 95, run.output
    padded = re.search(r"formula .*: [\d,]+ at Psi, ([\d,]+) at Psi_pad", run.output).group(1)
    totals = re.findall(r"^ +\d+ +[\d,]+ +[\d,]+ +([\d,]+) +[\d,]+ ", run.output, re.M)
    assert len(totals) == n and set(totals) == {padded}, run.output
    (line,) = [line for line in run.output.splitlines() if line.strip().startswith("ZeRO++:")]
    measured, formula = re.search(r": ([\d.]+ k?B) of scales per rank \(formula ([\d.]+ k?B)", line).groups()
    assert measured == formula, line
    block = int(flags[flags.index("--quant-block") + 1]) if "--quant-block" in flags else 2048
    shards = [-(-(n_in + 1) * n_out // n) for n_in, n_out in ((64, 128), (128, 128), (128, 10))]
    calls = (("--quantize-weights" in flags) * (1 if "--hpz" in flags else 2) + ("--quantize-grads" in flags))
    per_step = calls * sum(4 * (n - 1) * -(-shard // block) for shard in shards)
    records = [json.loads(text) for text in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(records) == 300 and all(r["comm"]["scales"]["bytes"] == per_step for r in records)


@pytest.mark.parametrize("flags, words", [((*QWZ, "--stage", "2"), "--quantize-weights is stage 3's"),
                                          ((*QWZ, "--overlap"), "--quantize-weights is stage 3's"),
                                          ((*QWZ, "--shard-group", "1"), "--quantize-weights is stage 3's"),
                                          ((*QWZ, "--quant-block", "0"), "--quant-block must be >= 1, got 0"),
                                          ((*QGZ, "--stage", "1"), "--quantize-grads is stages 2 and 3's"),
                                          ((*QGZ, "--overlap"), "--quantize-grads is stages 2 and 3's"),
                                          ((*QGZ, "--shard-group", "1"), "--quantize-grads is stages 2 and 3's"),
                                          ((*QGZ, "--device", "gpu", "--comm", "nccl"), "--quantize-grads is stages 2 and 3's"),
                                          (("--quant-error",), "--quant-error measures --quantize-weights and")])
def test_quantization_is_refused_with_one_line_where_it_does_not_exist(tmp_path, flags, words):
    run = launch(2, *FLAGS, "--steps", 1, *flags, cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == ExitCode.BAD_INPUT and len(errors) == 1 and words in errors[0], run.describe()


def test_quant_error_records_every_steps_errors_and_the_report_sums_them_up(tmp_path):
    """--quant-error: every --metrics record carries the step's two errors, TensorBoard's tags come from
    them, the report prints their mean and max over the steps; int4 gradients err more than int8
    weights, and the weights are bitwise those of the run that does not measure."""
    from zerompi.train.outputs.tensorboard import scalars
    flags = (*FLAGS, *QWZ, "--quantize-grads", "int4", "--quant-block", "256", "--steps", 8)
    run = train_ok(2, *flags, "--quant-error", "--metrics", tmp_path / "m.jsonl", "--report", "table",
                   "--save-weights", tmp_path / "measured.npz", cwd=tmp_path)
    train_ok(2, *flags, "--save-weights", tmp_path / "plain.npz", cwd=tmp_path)
    records = [json.loads(text) for text in (tmp_path / "m.jsonl").read_text().splitlines()]
    errors = [r["quant_error"] for r in records]
    assert len(errors) == 8 and all(0 < e["weights"] < 0.05 and e["weights"] < e["grads"] < 1 for e in errors)
    assert {"quant_error/weights", "quant_error/grads"} <= {tag for tag, _ in scalars(records[0])}
    (line,) = [line for line in run.output.splitlines() if "--quant-error" in line]
    mean = sum(e["grads"] for e in errors) / len(errors)
    assert f"the reduced gradients {mean:.3%} ({max(e['grads'] for e in errors):.3%})" in line, line
    plain, measured = load_weights(tmp_path / "plain.npz"), load_weights(tmp_path / "measured.npz")
    assert all(np.array_equal(plain[k], measured[k]) for k in plain)


def test_checkpoints_hold_the_exact_weights_and_resume_with_or_without_quantization(tmp_path):
    straight = tmp_path / "straight.npz"
    train_ok(2, *FLAGS, *QWZ, "--steps", 6, "--save-weights", straight, cwd=tmp_path)
    train_ok(2, *FLAGS, *QWZ, "--steps", 3, "--save-dir", tmp_path / "q", cwd=tmp_path)
    train_ok(2, *FLAGS, *QWZ, "--steps", 6, "--save-dir", tmp_path / "q", "--resume", "latest",
             "--save-weights", tmp_path / "resumed.npz", cwd=tmp_path)
    expected, got = load_weights(straight), load_weights(tmp_path / "resumed.npz")
    assert all(np.array_equal(got[k], expected[k]) for k in expected)      # the checkpoint was exact
    train_ok(2, *FLAGS, "--steps", 3, "--save-dir", tmp_path / "exact", cwd=tmp_path)
    runs = {}
    for n, stage, source, flags in ((3, 1, "q", ()), (2, 3, "q", ()), (3, 3, "exact", QWZ), (3, 2, "q", QGZ)):
        name = f"{source}-{n}-{stage}-{'-'.join(flags) or 'exact'}"
        train_ok(n, *FLAGS, *flags, "--stage", stage, "--steps", 6, "--resume", tmp_path / source / "step_00000003",
                 "--save-weights", tmp_path / f"{name}.npz", cwd=tmp_path)
        runs[name] = load_weights(tmp_path / f"{name}.npz")
        assert set(runs[name]) == set(expected)
    # the quantized run's checkpoint, resumed unquantized at (3, stage 1) and at (2, stage 3): the
    # same continuation, within float32's reduction order
    a, b = runs["q-3-1-exact"], runs["q-2-3-exact"]
    assert all(np.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)
    assert not all(np.allclose(a[k], expected[k], rtol=1e-5, atol=1e-6) for k in a)   # not the quantized run's
