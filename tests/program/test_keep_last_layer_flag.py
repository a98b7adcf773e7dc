"""`--keep-last-layer` (stage 3, zerompi/stages/stage3.py): the program saves the weights of the run
without it, bit for bit (under mpirun with accumulation and --overlap's prefetch; on in-process
ranks over two emulated nodes with hpZ and qwZ), its report's ledger equals the formula
(3M Psi - M psi_last)(N-1)/N, the dry run plans one all-gather fewer per micro-batch, and another
stage is refused with one line, exit 2."""
import re

import pytest

from test_cli import ERROR_MARK, launch, load_weights, train_ok
from test_in_process_cli import FLAGS, in_process, in_process_ok
from zerompi.util.exit_codes import ExitCode

LAST = (48 + 1) * 10                     # FLAGS' MLP 64-48-48-10: the last layer's elements


def same_weights(a, b):
    a, b = load_weights(a), load_weights(b)
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def formula_and_ledger(output):
    """(rank 0's params elements, its total, the formula at Psi_pad) from the report's communication
    table (the ledger counts the padded buffers); with qwZ also (the scales' bytes, their formula)."""
    row = re.search(r"^\s+0\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s", output, re.M)
    padded = re.search(r"M = \d micro-batches: [\d,]+ at Psi, ([\d,]+) at Psi_pad", output)
    scales = re.search(r"([\d.]+ [kM]?B) of scales per rank \(formula ([\d.]+ [kM]?B)", output)
    return ([int(x.replace(",", "")) for x in (*row.groups()[1:], padded.group(1))]
            + (list(scales.groups()) if scales else []))


@pytest.mark.parametrize("runner, n, flags", [
    ("mpirun", 2, ("--grad-accum", 2, "--overlap", "--prefetch", 2)),
    ("in-process", 4, ("--in-process-nodes", 2, "--hpz", "--quantize-weights", "int8", "--grad-accum", 2)),
    ("in-process", 3, ("--quantize-weights", "int8", "--quant-block", 64, "--grad-accum", 2)),
])
def test_it_saves_the_same_weights_and_its_ledger_is_the_formula(tmp_path, runner, n, flags):
    flags = (*FLAGS, "--stage", 3, *flags, "--steps", 4, "--report", "table")
    run = train_ok if runner == "mpirun" else in_process_ok
    plain = run(n, *flags, "--save-weights", tmp_path / "plain.npz", cwd=tmp_path)
    kept = run(n, *flags, "--keep-last-layer", "--save-weights", tmp_path / "kept.npz", cwd=tmp_path)
    assert same_weights(tmp_path / "plain.npz", tmp_path / "kept.npz")
    (params, total, formula, *scales), (kept_params, kept_total, kept_formula, *kept_scales) = map(
        formula_and_ledger, (plain.output, kept.output))
    group = n // 2 if "--hpz" in flags else n        # hpZ: backward gathers inside the node of 2
    padded_last = -(-LAST // n) * n
    assert params - kept_params == 2 * padded_last * (group - 1) // group    # 2 micro-batches
    assert kept_total == kept_formula and total == formula
    assert len(scales) == len(kept_scales) and scales[:1] == scales[1:] and kept_scales[:1] == kept_scales[1:]
    if "--quantize-weights" in flags:               # flat qwZ: the last layer's backward scales are not gathered
        assert scales and (scales == kept_scales) == ("--hpz" in flags)   # (hpZ's backward gathers are exact)
    assert f"psi_last = {LAST:,} elements" in kept.output and "psi_last" not in plain.output


def test_the_dry_run_plans_one_gather_fewer_per_micro_batch(tmp_path):
    plans = [launch(1, *FLAGS, "--dry-run", "--ranks", 4, "--grad-accum", 2, *keep, cwd=tmp_path)
             for keep in ((), ("--keep-last-layer",))]
    gathers = [int(re.search(r"^\s*all-gathers\s.*\s(\d+)$", p.output, re.M).group(1)) for p in plans]   # stage 3's
    assert all(p.returncode == 0 for p in plans) and gathers[0] - gathers[1] == 2, [p.output for p in plans]


def test_another_stage_is_refused_with_one_line(tmp_path):
    run = in_process(2, *FLAGS, "--stage", 2, "--keep-last-layer", "--steps", 1, cwd=tmp_path)
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert run.returncode == ExitCode.BAD_INPUT and errors == [
        f"{ERROR_MARK} --keep-last-layer keeps stage 3's last layer gathered into backward: it needs --stage 3"]
