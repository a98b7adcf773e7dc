"""The examples in examples/ run as their docstrings say; the plotting ones write, by default,
figures 1400 pixels wide or more to a folder git ignores (never over the tracked docs/figures/)."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from run_all import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


# ----------------------------------------------------------------------------------------------
# The plotting examples (matplotlib: the `plot` extra, also in `test`), on small runs
# ----------------------------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_WIDTH, MIN_HEIGHT = 1400, 500            # pixels: 10 inches at 150 dpi is 1500


def run_example(name, *args, cwd):
    pytest.importorskip("matplotlib", reason="the plotting examples need matplotlib: pip install '.[plot]'")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *map(str, args)],
                            cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def png_size(path):
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def the_default_figure(cwd):
    """The one PNG an example wrote under cwd without --out: checked readable and, were the example
    run at the top of this checkout, written where git ignores it (not over a tracked file)."""
    found = [os.path.relpath(os.path.join(root, name), cwd) for root, _, files in os.walk(cwd)
             for name in files if name.endswith(".png")]
    assert len(found) == 1, found
    width, height = png_size(os.path.join(cwd, found[0]))
    assert width >= MIN_WIDTH and height >= MIN_HEIGHT, (found[0], width, height)
    ignored = subprocess.run(["git", "-C", ROOT, "check-ignore", "-q", found[0]], capture_output=True, timeout=30)
    if ignored.returncode == 128:
        pytest.skip(f"not a git checkout: {ROOT}")
    assert ignored.returncode == 0, f"the default output {found[0]} is not ignored by git: it may be a tracked file"
    return found[0]


def test_plot_memory_draws_measured_memory_equal_to_the_formula(tmp_path):
    out = run_example("plot_memory.py", "--ranks", 1, 2, "--hidden", 16, "--steps", 1, cwd=tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("stage ")]
    assert len(rows) == 4
    for row in rows:              # "stage 1: N=1 0.003 MB (formula 0.003), N=2 ..."
        measured = [float(part.split()[1]) for part in row.split(": ", 1)[1].split(", ")]
        formula = [float(part.split("(formula ")[1].rstrip(")")) for part in row.split(", ")]
        assert measured == formula and measured[1] <= measured[0]
    assert the_default_figure(tmp_path) == os.path.join("runs", "figures", "memory_per_rank.png")


def test_plot_loss_and_timeline_draw_real_runs(tmp_path):
    (tmp_path / "loss").mkdir()
    run_example("plot_loss.py", "--ranks", 2, "--steps", 8, cwd=tmp_path / "loss")
    assert the_default_figure(tmp_path / "loss") == os.path.join("runs", "figures", "loss_curves.png")
    work = tmp_path / "timeline"
    work.mkdir()
    subprocess.run([mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", "--steps", "3", "--hidden", "16",
                    "--log-every", "0", "--report", "none", "--trace", "t.json"],
                   cwd=work, check=True, capture_output=True, timeout=120)
    run_example("plot_timeline.py", "t.json", cwd=work)
    assert the_default_figure(work) == os.path.join("runs", "figures", "timeline.png")
    run_example("plot_timeline.py", "t.json", "--out", "a/b/t.png", cwd=work)       # --out: its folder created
    assert png_size(work / "a" / "b" / "t.png")[0] >= MIN_WIDTH


def test_memory_preflight_example_refuses_stage_0_and_trains_stage_3(tmp_path):
    """examples/memory_preflight.sh, as docs/planning.md shows it (each rank needs 1.7 GB at
    stage 3: skipped where the node has less than 8 GB available for the 4 ranks)."""
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    if available < 8e9:
        pytest.skip(f"the example's 4 ranks need 8 GB of available memory, this machine has {available / 1e9:.1f}")
    env = dict(os.environ, PATH=os.path.dirname(mpirun()) + os.pathsep + os.environ["PATH"])
    result = subprocess.run(["sh", os.path.join(ROOT, "examples", "memory_preflight.sh")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    errors = [line for line in out.splitlines() if line.startswith("zerompi: error:")]
    assert len(errors) == 1 and errors[0].startswith("zerompi: error: stage 0 on 4 ranks needs "), out
    assert "(the address-space limit (ulimit -v)" in errors[0] and errors[0].endswith("fit on 4 ranks"), out
    assert "stage 3 (" in errors[0], out
    assert out.count("exit status 2") == 1 and out.count("exit status 0") == 1, out
    assert "held-out accuracy" in out and "Traceback" not in out, out


def test_offload_example_trains_under_the_cap_that_refuses_stage_3_in_memory(tmp_path):
    """examples/offload_under_a_memory_cap.sh, as docs/offload.md shows it: under the cap the
    preflight refuses in-memory stage 3 and names the file tier; the file tier trains, prints its
    bytes per tier, and saves the uncapped in-memory run's weights bit for bit."""
    env = dict(os.environ, PATH=os.path.dirname(mpirun()) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1")
    result = subprocess.run(["sh", os.path.join(ROOT, "examples", "offload_under_a_memory_cap.sh"), str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    errors = [line for line in out.splitlines() if line.startswith("zerompi: error:")]
    assert len(errors) == 1 and errors[0].startswith("zerompi: error: stage 3 on 2 ranks needs "), out
    assert errors[0].endswith("stage 3 with --offload-optimizer file (571.0 MB) fits on 2 ranks"), out
    assert out.count("exit status 2") == 1 and "Offloaded optimizer state per rank" in out, out
    assert result.stdout.rstrip().endswith("the weights are bit for bit the same"), out
    assert sorted(p.name for p in (tmp_path / "offload").iterdir()) == []      # nothing left behind
