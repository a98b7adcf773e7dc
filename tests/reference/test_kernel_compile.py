"""tests/support/kernel_compile_check.py: every GPU kernel compiles with NVRTC for every --dtype. Needs
CuPy and NVRTC (no GPU); skips, saying which is missing, elsewhere (CI installs neither: the
CuPy and CUDA wheels are about 500 MB)."""
import importlib

import pytest

import kernel_compile_check


def nvrtc_or_skip():
    try:
        importlib.import_module("cupy")
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as e:
        pytest.skip(f"needs CuPy and NVRTC ({type(e).__name__}: {str(e).splitlines()[0][:100]})")


@pytest.mark.parametrize("label,source", kernel_compile_check.checks(), ids=lambda x: x.split(" (")[0][:60])
def test_kernel_compiles(label, source):
    nvrtc_or_skip()
    assert kernel_compile_check.compile_errors(source) is None, label


def test_a_broken_body_is_caught():
    """The check can fail: bfloat16 has no conversion from a pointer."""
    nvrtc_or_skip()
    source = kernel_compile_check.kernel_source("add_bias", dict(T="float", B="bfloat16"))
    assert kernel_compile_check.compile_errors(source.replace("(T)bias", "(T)&bias")) is not None
