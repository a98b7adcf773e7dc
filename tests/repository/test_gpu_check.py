"""tests/gpu_check.py under pytest: runs where CuPy sees a GPU, skips with the reason elsewhere."""
import os
import subprocess
import sys

import pytest


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # tests/


def no_gpu_reason():
    code = "import os; from zerompi.train.options.device_choice import select_device; print(select_device('gpu', os.environ)[1] or '')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
    return out


@pytest.mark.timeout(600)
def test_gpu_check():
    reason = no_gpu_reason()                 # asked in a subprocess: this process keeps no CUDA context
    if reason:
        pytest.skip(f"no GPU here: {reason}")
    result = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py")], capture_output=True,
                            text=True, timeout=540)
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all checks passed" in result.stdout


def test_the_gpu_check_says_why_it_skips_without_a_gpu():
    if not no_gpu_reason():
        pytest.skip("this machine has a GPU: test_gpu_check runs the real check")
    result = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("SKIPPED: --device gpu: ")
