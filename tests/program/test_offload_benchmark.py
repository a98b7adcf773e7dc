"""benchmarks/offload.py, run small: its rows and its counts (never its times: a benchmark's
speed is a measurement, not a check)."""
import json
import os
import subprocess
import sys

from test_cli import _mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_offload_benchmark_counts_each_tile_once_each_way(tmp_path):
    (tmp_path / "offload").mkdir()
    out = tmp_path / "offload.json"
    sizes = [64, 256, 256, 10]
    result = subprocess.run([_mpirun(), "-n", "2", sys.executable, os.path.join(ROOT, "benchmarks", "offload.py"),
                             "--dir", str(tmp_path / "offload"), "--sizes", ",".join(map(str, sizes)),
                             "--repeats", "2", "--steps", "2", "--warmup", "1", "--json", str(out)],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == ["none", "file", "file+par"]
    owned = sum(-(-((a + 1) * b) // 2) for a, b in zip(sizes, sizes[1:]))     # stage 3, N = 2: padded halves
    assert rows["file"]["file_read_per_step"] == rows["file"]["file_written_per_step"] == 2 * 4 * owned
    # the shard too: read at each of the 2 accesses of a micro-batch and by the update, written by it
    assert rows["file+par"]["file_read_per_step"] == 2 * 4 * owned + 3 * 4 * owned
    assert rows["file+par"]["file_written_per_step"] == 2 * 4 * owned + 4 * owned
    assert rows["file+par"]["ledger"]["file"] == 3 * 4 * owned and rows["file+par"]["hidden_share"] <= 1
    assert rows["none"]["file_read_per_step"] == 0 and rows["file"]["ledger"]["file"] == 2 * 4 * owned
    assert "ZeRO-Infinity efficiency" in result.stdout and os.listdir(tmp_path / "offload") == []
