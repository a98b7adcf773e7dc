"""benchmarks/in_process.py runs small (N = 1 and 2, one round of two steps): mpirun's ranks and the
in-process ranks both time their steps, and the table prints each N with its ratio, the CPU and
the BLAS beside it (docs/in-process.md has a full run)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_the_benchmark_times_both_transports_side_by_side():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "in_process.py"), "--ranks", "1,2",
                             "--steps", "2", "--warmup", "1", "--rounds", "1", "--hidden", "16"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    header, columns, *rows = result.stdout.strip().splitlines()
    assert "BLAS" in header and "CPUs" in header and columns.split() == ["N", "mpirun", "ms", "in-process", "ms", "ratio"]
    numbers = [re.fullmatch(r"\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", row).groups() for row in rows]
    assert [n for n, *_ in numbers] == ["1", "2"] and all(float(x) > 0 for row in numbers for x in row[1:])
