"""Outputs colleagues can use: file modes that follow the umask, a float32 export, suffixes that match.

    umask           every file and folder a training run (--save-dir, --save-weights, --metrics,
                    --trace) and `python -m zerompi.checkpoint export/consolidate` create has the
                    mode a plain open() or mkdir() gives: 0o666 & ~umask, 0o777 & ~umask; the
                    lock too
    bf16 export     `safetensors.numpy.load_file`, in a fresh interpreter, fails on a bf16 export
                    unless ml_dtypes is imported first; `export --dtype float32` loads without it,
                    its values the checkpoint's bf16 values widened exactly
    suffixes        `export` writes .safetensors and `consolidate` writes .npz: another suffix is
                    one line, exit 2, nothing written
"""
import os
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_cli import _mpirun, load_weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 120
COMMON = ["--hidden", "9,7", "--batch-size", 12, "--data", "synthetic", "--report", "none", "--log-every", 0]


def under_umask(umask, args, cwd):
    """Run args in cwd under `umask` (a shell sets it, then execs), in its own session, killed
    with every process it started if it runs past TIMEOUT; returns the CompletedProcess."""
    process = subprocess.Popen(["sh", "-c", f'umask {umask:03o} && exec "$@"', "sh", *map(str, args)], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"timed out: {args}\n{stdout}{stderr}")
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{stdout}{stderr}"
    return result


def modes_under(folder):
    """{relative path: permission bits} of everything under folder."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


UMASKS = [0o002, 0o077]      # group-writable and private: any mode written without the umask fails one


@pytest.mark.parametrize("umask", UMASKS, ids=lambda u: f"umask-{u:03o}")
def test_every_file_and_folder_created_has_the_mode_the_umask_gives(umask, tmp_path):
    train = [_mpirun(), "-n", 2, sys.executable, "-m", "zerompi.train", "--steps", 4, "--save-every", 2,
             "--dtype", "bf16", *COMMON, "--save-dir", "runs/a/ck", "--save-weights", "w.npz",
             "--metrics", "m.jsonl", "--trace", "t.json"]
    under_umask(umask, train, tmp_path)
    tool = [sys.executable, "-m", "zerompi.checkpoint"]
    under_umask(umask, [*tool, "export", "runs/a/ck", "e.safetensors", "--optimizer"], tmp_path)
    under_umask(umask, [*tool, "export", "runs/a/ck", "f.safetensors", "--dtype", "float32"], tmp_path)
    under_umask(umask, [*tool, "consolidate", "runs/a/ck", "c.npz"], tmp_path)
    modes = modes_under(tmp_path)
    expected_files = {"w.npz", "m.jsonl", "t.json", "e.safetensors", "f.safetensors", "c.npz",
                      "runs/a/ck/latest", "runs/a/ck/step_00000004/manifest.json",
                      "runs/a/ck/step_00000004/rank00001.master.npy"}
    assert expected_files <= set(modes), sorted(modes)
    assert {"runs", "runs/a", "runs/a/ck", "runs/a/ck/step_00000002"} <= set(modes), sorted(modes)
    wrong = {path: oct(mode) for path, mode in modes.items()
             if mode != (0o777 if os.path.isdir(tmp_path / path) else 0o666) & ~umask}
    assert wrong == {}, f"umask {umask:03o}: want files {0o666 & ~umask:o}, folders {0o777 & ~umask:o}"


@pytest.mark.parametrize("umask", [0o002, 0o077], ids=lambda u: f"umask-{u:03o}")
def test_the_lock_file_has_the_mode_the_umask_gives(umask, tmp_path):
    script = textwrap.dedent("""
        import os, stat, sys
        from zerompi.train.loop.lock import take_lock
        take_lock(sys.argv[1])
        print(oct(stat.S_IMODE(os.stat(os.path.join(sys.argv[1], ".lock")).st_mode)))
    """)
    result = under_umask(umask, [sys.executable, "-c", script, tmp_path], tmp_path)
    assert result.stdout.strip() == oct(0o666 & ~umask)


# ----------------------------------------------------------------------------------------------
# A bf16 export, read by safetensors.numpy in a fresh interpreter
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A folder holding ck/ (a bf16 N=2 stage-1 run's checkpoints) and w.npz (its weights, widened)."""
    folder = tmp_path_factory.mktemp("bf16")
    under_umask(0o022, [_mpirun(), "-n", 2, sys.executable, "-m", "zerompi.train", "--stage", 1, "--dtype", "bf16",
                        "--steps", 3, *COMMON, "--save-dir", "ck", "--save-weights", "w.npz"], folder)
    return folder


def checkpoint_tool(*args, cwd):
    return subprocess.run([sys.executable, "-m", "zerompi.checkpoint", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


LOAD = """
import sys
{preamble}
from safetensors.numpy import load_file
import numpy as np
tensors = load_file(sys.argv[1])
np.savez(sys.argv[2], **{{name: t.astype(np.float32) for name, t in tensors.items()}})
print(sorted({{str(t.dtype) for t in tensors.values()}}), "ml_dtypes" in sys.modules)
"""


def load_in_fresh_python(path, out, preamble=""):
    """safetensors.numpy.load_file(path) in a new interpreter that imports nothing else of ours;
    the tensors, as float32, saved to out. Returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", LOAD.format(preamble=preamble), str(path), str(out)],
                          capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def test_bf16_export_loads_with_safetensors_numpy_only_after_ml_dtypes_and_float32_loads_anywhere(bf16_run, tmp_path):
    assert checkpoint_tool("export", bf16_run / "ck", "bf16.safetensors", cwd=tmp_path).returncode == 0
    plain = load_in_fresh_python(tmp_path / "bf16.safetensors", tmp_path / "x.npz")
    assert plain.returncode != 0 and "bfloat16" in plain.stderr, plain.stderr      # what docs/checkpoints.md says
    loaded = load_in_fresh_python(tmp_path / "bf16.safetensors", tmp_path / "a.npz", "import ml_dtypes")
    assert loaded.returncode == 0 and loaded.stdout.strip() == "['bfloat16'] True", loaded.stderr

    result = checkpoint_tool("export", bf16_run / "ck", "f32.safetensors", "--dtype", "float32", "--optimizer",
                             cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "float32" in result.stdout
    widened = load_in_fresh_python(tmp_path / "f32.safetensors", tmp_path / "b.npz")
    assert widened.returncode == 0 and widened.stdout.strip() == "['float32'] False", widened.stderr

    bf16, f32 = load_weights(tmp_path / "a.npz"), load_weights(tmp_path / "b.npz")
    saved = load_weights(bf16_run / "w.npz")                   # the run's --save-weights: bf16 widened
    assert sorted(f32) == sorted(bf16) + sorted(f"optimizer.{k}.{n}" for k in ("m", "master", "v") for n in bf16)
    for name in bf16:                            # bf16 -> float32 is exact: the same numbers, bit for bit
        assert np.array_equal(f32[name].view(np.uint32), bf16[name].view(np.uint32)), name
        assert np.array_equal(f32[name].view(np.uint32), saved[name].view(np.uint32)), name


# ----------------------------------------------------------------------------------------------
# The suffix names the format
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, output, says", [
    ("export", "out.npz", "consolidate"), ("export", "out", ".safetensors"),
    ("export", "out.SAFETENSORS", ".safetensors"),
    ("consolidate", "out.safetensors", "export"), ("consolidate", "out.json", ".npz"),
    ("export", "existing.npz", "consolidate")])
def test_an_output_whose_suffix_is_not_the_commands_format_is_refused(command, output, says, bf16_run, tmp_path):
    (tmp_path / "existing.npz").write_bytes(b"keep me")
    before = sorted(os.listdir(tmp_path))
    result = checkpoint_tool(command, bf16_run / "ck", output, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zerompi.checkpoint: error: {output}: ") and says in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "existing.npz").read_bytes() == b"keep me"
