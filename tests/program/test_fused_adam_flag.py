"""`--fused-adam` (zerompi/fused/): the run saves the weights of the run without it, bit for bit
(under mpirun in bf16 with accumulation and clipping, on in-process ranks, with the optimizer
state in a file), and its header says which AdamW ran; without Numba, and on a GPU whose update
is one kernel already, it is refused with one line, exit 2."""
import subprocess
import sys
from types import SimpleNamespace

import pytest

from test_cli import ERROR_MARK, load_weights, train_ok
from test_in_process_cli import FLAGS, in_process_ok
from zerompi.inprocess import run_ranks
from zerompi.train.loop.offload_folder import adam_config_for
from zerompi.util.exit_codes import ExitCode


def same_weights(a, b):
    a, b = load_weights(a), load_weights(b)
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("n, flags", [
    (2, ("--stage", 3, "--dtype", "bf16", "--grad-accum", 2, "--clip-norm", 0.5)),
    (2, ("--stage", 2, "--offload-optimizer", "file", "--offload-dir", ".")),
])
def test_mpirun_saves_the_same_weights_with_it(tmp_path, n, flags):
    flags = (*FLAGS, *flags, "--steps", 6)
    train_ok(n, *flags, "--save-weights", tmp_path / "numpy.npz", cwd=tmp_path)
    train_ok(n, *flags, "--fused-adam", "--save-weights", tmp_path / "fused.npz", cwd=tmp_path)
    assert same_weights(tmp_path / "numpy.npz", tmp_path / "fused.npz")


def test_in_process_ranks_save_the_same_weights_with_it_and_say_so(tmp_path):
    flags = (*FLAGS, "--stage", 1, "--steps", 6, "--report", "table")
    plain = in_process_ok(3, *flags, "--save-weights", tmp_path / "numpy.npz", cwd=tmp_path)
    fused = in_process_ok(3, *flags, "--fused-adam", "--save-weights", tmp_path / "fused.npz", cwd=tmp_path)
    assert same_weights(tmp_path / "numpy.npz", tmp_path / "fused.npz")
    assert "AdamW fused (Numba)" in fused.output.splitlines()[0] and "fused" not in plain.output
    work = [line for line in fused.output.splitlines() if line.startswith("   0 ")]
    assert work and work != [line for line in plain.output.splitlines() if line.startswith("   0 ")]  # no scratch


@pytest.mark.parametrize("flags", [("--in-process-ranks", 2), ("--dry-run", "--ranks", 2)], ids=["run", "dry-run"])
def test_without_numba_it_is_one_line_exit_2(tmp_path, flags):
    code = ("import sys; sys.modules['numba'] = None\n"             # importing it raises ImportError
            "import runpy; runpy.run_module('zerompi.train', run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", code, *map(str, flags), "--fused-adam", "--steps", "2"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == ExitCode.BAD_INPUT, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"{ERROR_MARK} --fused-adam needs Numba: pip install -e '.[fast]' (or pip install numba)"]


def test_on_a_gpu_without_offload_it_is_refused_and_with_offload_it_runs(capsys):
    """adam_config_for on a device that is a GPU (the GPU's own update is zerompi/devices/kernels.py's)."""
    gpu = SimpleNamespace(is_gpu=True)

    def rank(comm, offload):
        cfg = SimpleNamespace(fused_adam=True, offload_optimizer=offload, offload_params="none", offload_dir="",
                              beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
        try:
            config = adam_config_for(cfg, comm, gpu, sys.stdout)
        except SystemExit as e:
            return e.code
        return type(config).__name__, type(config.kernel).__name__
    assert run_ranks(lambda comm: rank(comm, "none"), 2) == [ExitCode.BAD_INPUT] * 2
    assert capsys.readouterr().err.splitlines() == [
        f"{ERROR_MARK} --fused-adam compiles the CPU's AdamW, and this run updates on the GPU in one kernel "
        "already (it applies with --offload-optimizer, whose update runs on the CPU)"]
    assert run_ranks(lambda comm: rank(comm, "host"), 2) == [("OffloadedAdamConfig", "FusedAdamKernel")] * 2
