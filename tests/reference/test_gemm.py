"""zerompi/devices/gemm.py without a GPU: the row-major to column-major bookkeeping handed to cuBLAS.

cublas_arguments turns c = op(a) @ op(b) on row-major arrays into cublasGemmEx's arguments.
Replayed by a column-major GEMM written out in NumPy (tests/support/device_stand_in.py: what cuBLAS does
with those arguments), every transpose combination and shape must give NumPy's matmul; a swapped
operand, transpose flag or leading dimension gives another matrix or reads out of place.

gemm() itself runs against stand-in `cupy.cuda.device` and `cupy_backends.cuda.libs.cublas`
modules whose gemmEx maps each pointer back to its array, checks the data types and the alpha and
beta it reads from host memory, and replays the call: the argument order, scalars and types that
only a GPU would otherwise check.
"""
import ctypes
import sys
import types

import ml_dtypes
import numpy as np
import pytest

from device_stand_in import column_major_gemm, stand_in_gemm
from zerompi.devices import gemm
from zerompi.precision import precision_for

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(1, 1, 1), (3, 5, 7), (7, 2, 5), (1, 9, 4), (6, 1, 3), (24, 13, 37)]    # (M, K, N)


def operands(M, K, N, trans_a, trans_b, dtype, rng):
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(dtype)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(dtype)
    return a, b


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_cublas_arguments_compute_the_row_major_product(M, K, N, trans_a, trans_b):
    rng = np.random.default_rng(M * 100 + K * 10 + N)
    a, b = operands(M, K, N, trans_a, trans_b, np.float64, rng)
    c = np.full((M, N), np.nan)
    stand_in_gemm(a, b, c, trans_a, trans_b)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b)
    np.testing.assert_allclose(c, want, rtol=1e-13, atol=1e-13)


def test_accumulate_adds_to_what_is_there():
    rng = np.random.default_rng(0)
    a, b = operands(5, 4, 3, True, False, np.float64, rng)
    start = rng.standard_normal((5, 3))
    c = start.copy()
    stand_in_gemm(a, b, c, trans_a=True, accumulate=True)
    np.testing.assert_allclose(c, start + a.T @ b, rtol=1e-13)


def test_16bit_operands_accumulate_in_float32_and_round_once():
    """bf16 in, float32 out: exactly float32's product of the bf16 values; bf16 out: that product
    rounded once (not a sum of bf16 roundings)."""
    rng = np.random.default_rng(1)
    a, b = operands(8, 64, 6, False, True, BF16, rng)
    exact = a.astype(np.float32) @ b.astype(np.float32).T
    wide = np.zeros((8, 6), np.float32)
    stand_in_gemm(a, b, wide, trans_b=True)
    np.testing.assert_allclose(wide, exact, rtol=1e-6, atol=1e-6)
    narrow = np.zeros((8, 6), BF16)
    stand_in_gemm(a, b, narrow, trans_b=True)
    np.testing.assert_array_equal(narrow, wide.astype(BF16))


def test_a_row_vector_times_a_matrix_is_the_column_sum():
    """The bias gradient: db (1, O) = 1^T (1, B) dy (B, O)."""
    dy = np.random.default_rng(2).standard_normal((11, 4)).astype(np.float32)
    db = np.zeros(4, np.float32)
    stand_in_gemm(np.ones(11, np.float32)[None, :], dy, db[None, :])
    np.testing.assert_allclose(db, dy.sum(axis=0), rtol=1e-6)


@pytest.mark.parametrize("a_shape,b_shape,c_shape,trans", [((3, 4), (5, 6), (3, 6), (False, False)),
                                                           ((3, 4), (4, 6), (6, 3), (False, False)),
                                                           ((3, 4), (6, 4), (3, 6), (True, True))])
def test_mismatched_shapes_are_refused(a_shape, b_shape, c_shape, trans):
    with pytest.raises(ValueError, match="cannot fill c"):
        gemm.cublas_arguments(np.zeros(a_shape), np.zeros(b_shape), np.zeros(c_shape), *trans)


def test_a_strided_view_is_refused():
    """cuBLAS would read the view's memory as if it were contiguous: wrong numbers, no error."""
    a = np.zeros((6, 4))[:, :2]
    with pytest.raises(ValueError, match="C-contiguous"):
        gemm.cublas_arguments(a, np.zeros((2, 3)), np.zeros((6, 3)))


@pytest.mark.parametrize("name", ["float64", "float32", "bf16", "fp16"])
def test_every_precision_has_a_cuda_type_and_an_accumulation_type(name):
    precision = precision_for(name)
    for dtype in (precision.storage, precision.compute):
        assert dtype.name in gemm.CUDA_TYPE
    assert gemm.ACCUMULATE[precision.storage.name] == (
        gemm.CUBLAS_COMPUTE_64F if precision.storage.itemsize == 8 else gemm.CUBLAS_COMPUTE_32F)


# ---------------------------------------------------------------- gemm() itself, with a stand-in cuBLAS

class HostAsDevice(np.ndarray):
    """A NumPy array with CuPy's `.data.ptr`: what zerompi.devices.gemm hands to cuBLAS."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def stand_in_cuda(monkeypatch, arrays):
    """Install `cupy.cuda.device` and `cupy_backends.cuda.libs.cublas` stand-ins whose gemmEx finds
    the arrays behind its pointers and does what cuBLAS does with them; returns the call log."""
    calls = []
    by_pointer = {a.ctypes.data: a for a in arrays}
    by_type = {code: name for name, code in gemm.CUDA_TYPE.items()}

    def scalar(pointer, compute):
        c_type = ctypes.c_float if compute == gemm.CUBLAS_COMPUTE_32F else ctypes.c_double
        return c_type.from_address(pointer).value

    def gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                compute, algo):
        first, second, out = by_pointer[A], by_pointer[B], by_pointer[C]
        assert (by_type[Atype], by_type[Btype], by_type[Ctype]) == (first.dtype.name, second.dtype.name,
                                                                     out.dtype.name)
        assert scalar(alpha, compute) == 1.0 and scalar(beta, compute) in (0.0, 1.0)
        calls.append((handle, algo))
        column_major_gemm(transa, transb, m, n, k, first, lda, second, ldb, out, ldc, compute,
                          accumulate=scalar(beta, compute) == 1.0)

    cublas = types.SimpleNamespace(setPointerMode=lambda handle, mode: calls.append(("mode", mode)),
                                   gemmEx=gemm_ex)
    device = types.SimpleNamespace(get_cublas_handle=lambda: "handle")
    for name, module in (("cupy", types.SimpleNamespace()), ("cupy.cuda", types.SimpleNamespace(device=device)),
                         ("cupy_backends", types.SimpleNamespace()), ("cupy_backends.cuda", types.SimpleNamespace()),
                         ("cupy_backends.cuda.libs", types.SimpleNamespace(cublas=cublas))):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("dtype,out_dtype,accumulate", [(np.float64, np.float64, False), (BF16, np.float32, False),
                                                        (np.float16, np.float16, True), (np.float32, np.float32, True)])
def test_gemm_hands_cublas_the_right_pointers_types_and_scalars(monkeypatch, trans_a, trans_b, dtype, out_dtype,
                                                                accumulate):
    rng = np.random.default_rng(3)
    a, b = (x.view(HostAsDevice) for x in operands(5, 7, 3, trans_a, trans_b, dtype, rng))
    start = rng.standard_normal((5, 3)).astype(out_dtype)
    c = start.copy().view(HostAsDevice)
    calls = stand_in_cuda(monkeypatch, [a, b, c])
    gemm.gemm(a, b, c, trans_a, trans_b, accumulate)
    wide = np.float64 if dtype == np.float64 else np.float32
    want = (a.T if trans_a else a).astype(wide) @ (b.T if trans_b else b).astype(wide)
    if accumulate:
        want += start.astype(wide)
    np.testing.assert_array_equal(np.asarray(c), want.astype(out_dtype))
    assert calls == [("mode", gemm.CUBLAS_POINTER_MODE_HOST), ("handle", gemm.CUBLAS_GEMM_DEFAULT)]


def test_gemm_refuses_mixed_operands_and_skips_an_empty_product(monkeypatch):
    a, b = np.zeros((2, 3), np.float16).view(HostAsDevice), np.zeros((3, 4), np.float32).view(HostAsDevice)
    c = np.zeros((2, 4), np.float32).view(HostAsDevice)
    calls = stand_in_cuda(monkeypatch, [a, b, c])
    with pytest.raises(TypeError, match="float16 but b is float32"):
        gemm.gemm(a, b, c)
    empty = np.zeros((0, 4), np.float32).view(HostAsDevice)
    gemm.gemm(np.zeros((0, 3), np.float32).view(HostAsDevice), b, empty)
    assert calls == []
