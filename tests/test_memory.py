"""Tests for zerompi.memory: the ZeRO memory and communication formulas and the CLI."""

import os
import subprocess
import sys

import pytest

from zerompi.memory import (
    FP32,
    MIXED_PRECISION,
    BytesPerParam,
    comm_elements_per_step,
    main,
    model_state_bytes,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The source article's table for a 7B model, mixed-precision Adam.
TABLE_7B = """\
Per-GPU memory (GB) for a 7B parameter model
  GPUs    Baseline    Stage 1    Stage 2    Stage 3
----------------------------------------------------
     1      112.0G     112.0G     112.0G     112.0G
     4      112.0G      49.0G      38.5G      28.0G
     8      112.0G      38.5G      26.2G      14.0G
    16      112.0G      33.2G      20.1G       7.0G
    32      112.0G      30.6G      17.1G       3.5G
    64      112.0G      29.3G      15.5G       1.8G
   128      112.0G      28.7G      14.8G       0.9G
"""


def test_bytes_per_param_presets():
    assert MIXED_PRECISION == BytesPerParam(param=2, grad=2, optimizer=12)
    assert FP32 == BytesPerParam(param=4, grad=4, optimizer=8)


def test_cli_prints_source_article_table_for_7b(capsys):
    assert main(["--params", "7e9"]) == 0
    out = capsys.readouterr().out
    assert TABLE_7B in out


def test_cli_via_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "zerompi.memory", "--params", "7e9"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert TABLE_7B in result.stdout


def test_zero_paper_figure_1():
    # Ψ = 7.5B, N = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    expected_gb = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected_gb.items():
        total = model_state_bytes(stage, 7.5e9, 64, MIXED_PRECISION)["total"]
        assert round(total / 1e9, 1) == gb, stage


def test_fp32_hand_computed():
    # Ψ = 1000, N = 4, P = 4, G = 4, K = 8.
    expected = {
        0: {"params": 4000, "grads": 4000, "optimizer": 8000, "total": 16000},
        1: {"params": 4000, "grads": 4000, "optimizer": 2000, "total": 10000},
        2: {"params": 4000, "grads": 1000, "optimizer": 2000, "total": 7000},
        3: {"params": 1000, "grads": 1000, "optimizer": 2000, "total": 4000},
    }
    for stage, want in expected.items():
        assert model_state_bytes(stage, 1000, 4, FP32) == pytest.approx(want), stage


def test_one_rank_partitions_nothing():
    baseline = model_state_bytes(0, 1e6, 1, MIXED_PRECISION)
    assert baseline["total"] == 16e6
    for stage in (1, 2, 3):
        assert model_state_bytes(stage, 1e6, 1, MIXED_PRECISION) == baseline


def test_custom_bytes_per_param():
    b = BytesPerParam(param=1, grad=3, optimizer=5)
    assert model_state_bytes(2, 100, 10, b) == pytest.approx(
        {"params": 100, "grads": 30, "optimizer": 50, "total": 180})


@pytest.mark.parametrize("num_ranks", [2, 4, 8, 64])
def test_comm_volume(num_ranks):
    psi = 1e9
    for stage in (0, 1, 2):
        assert comm_elements_per_step(stage, psi, num_ranks) == pytest.approx(
            2 * psi * (num_ranks - 1) / num_ranks)
    assert comm_elements_per_step(3, psi, num_ranks) == pytest.approx(
        3 * psi * (num_ranks - 1) / num_ranks)


def test_comm_volume_examples():
    assert comm_elements_per_step(0, 1000, 4) == 1500
    assert comm_elements_per_step(3, 1000, 4) == 2250


def test_comm_volume_single_rank_is_zero():
    for stage in (0, 1, 2, 3):
        assert comm_elements_per_step(stage, 7e9, 1) == 0


@pytest.mark.parametrize("stage", [-1, 4, 1.5, "1"])
def test_bad_stage(stage):
    with pytest.raises(ValueError, match="stage"):
        model_state_bytes(stage, 1e9, 8, MIXED_PRECISION)
    with pytest.raises(ValueError, match="stage"):
        comm_elements_per_step(stage, 1e9, 8)


@pytest.mark.parametrize("num_ranks", [0, -4])
def test_bad_ranks(num_ranks):
    with pytest.raises(ValueError, match="num_ranks"):
        model_state_bytes(1, 1e9, num_ranks, MIXED_PRECISION)
    with pytest.raises(ValueError, match="num_ranks"):
        comm_elements_per_step(1, 1e9, num_ranks)


@pytest.mark.parametrize("num_params", [0, -1, float("nan")])
def test_bad_params(num_params):
    with pytest.raises(ValueError, match="num_params"):
        model_state_bytes(1, num_params, 8, MIXED_PRECISION)
    with pytest.raises(ValueError, match="num_params"):
        comm_elements_per_step(1, num_params, 8)


def test_cli_fp32_and_bytes_override(capsys):
    assert main(["--params", "1e9", "--precision", "fp32", "--ranks", "2"]) == 0
    fp32_out = capsys.readouterr().out
    assert "     2       16.0G      12.0G      10.0G       8.0G" in fp32_out

    assert main(["--params", "1e9", "--bytes", "4", "4", "8", "--ranks", "2"]) == 0
    bytes_out = capsys.readouterr().out
    assert "     2       16.0G      12.0G      10.0G       8.0G" in bytes_out


def test_cli_comm_table(capsys):
    # Ψ = 7e9, N = 4, 2-byte elements: stages 0-2 move 10.5e9 elements (21 GB),
    # stage 3 moves 15.75e9 elements (31.5 GB).
    assert main(["--params", "7e9", "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("     4")][-1]
    assert "10.50e9 / 21.0G" in row and "15.75e9 / 31.5G" in row


@pytest.mark.parametrize("argv", [
    ["--params", "-1"],
    ["--params", "0"],
    ["--params", "abc"],
    ["--params", "7e9", "--ranks", "0"],
    ["--params", "7e9", "--ranks", "4", "-2"],
    ["--params", "7e9", "--precision", "fp16"],
    ["--params", "7e9", "--precision", "fp32", "--bytes", "2", "2", "12"],
    [],
])
def test_cli_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert "Traceback" not in err
