"""The examples in examples/ run as their docstrings say."""
import os
import subprocess
import sys

import numpy as np

from run_all import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_spirals_example_writes_a_loadable_dataset_that_trains(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "spirals_npz.py"), "sp.npz"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    with np.load(tmp_path / "sp.npz", allow_pickle=False) as f:
        assert f["x"].shape == (3000, 2) and f["x_test"].shape == (600, 2)
        assert set(np.unique(f["y"])) == {0, 1, 2}
    result = subprocess.run([mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", "--data", "sp.npz",
                             "--hidden", "64,64", "--steps", "400", "--batch-size", "128", "--report", "none",
                             "--log-every", "0"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    accuracy = float(result.stdout.split("held-out accuracy ")[1].split("%")[0])
    assert accuracy > 90


def test_compare_stages_example_prints_four_stages():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "compare_stages.py"), "2", "16"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    optimizer_bytes = [float(row[3]) for row in rows]
    assert optimizer_bytes[1] == optimizer_bytes[0] / 2        # stage 1 halves Adam's state at N = 2
