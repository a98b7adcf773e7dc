"""benchmarks/growth.py runs small (N = 1 and 2, one width): each row's measured step beside the
cost model's prediction from a calibration made at that N, their ratio, and the CPU and BLAS in
its first line."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(600)
def test_every_row_has_the_cost_models_prediction_beside_it(tmp_path):
    path = tmp_path / "growth.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "growth.py"), "--ranks", "1,2",
                             "--widths", "64", "--base-width", "64", "--stages", "0,3", "--others-limit", "1", "--json", str(path)],
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    header, columns, *rows = result.stdout.strip().splitlines()[:-1]          # the last: "wrote PATH"
    assert "BLAS:" in header and "cores" in header and "predicted  pred/meas" in columns
    assert len(rows) == 4                                                        # (N = 1, 2) x (stages 0, 3)
    data = json.loads(path.read_text())["rows"]
    for row, line in zip(data, rows):
        assert row["predicted_s"] > 0 and row["step_s"] > 0
        ratio = float(re.split(r"\s+", line.split("|")[0].strip())[-1])
        assert ratio == pytest.approx(row["predicted_s"] / row["step_s"], abs=0.006)
