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
                                          ((*QGZ, "--device", "gpu", "--comm", "nccl"), "--quantize-grads is stages 2 and 3's")])
def test_quantization_is_refused_with_one_line_where_it_does_not_exist(tmp_path, flags, words):
    run = launch(2, *FLAGS, "--steps", 1, *flags, cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == ExitCode.BAD_INPUT and len(errors) == 1 and words in errors[0], run.describe()


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
