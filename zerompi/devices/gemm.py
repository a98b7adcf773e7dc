"""Matrix multiplies on the GPU: one cuBLAS GemmEx call each, 16-bit inputs on tensor cores.

    c (M, N) = op(a) (M, K) @ op(b) (K, N)   [+ c, with accumulate]      op(x) = x or x^T

    a, b (same dtype)   c                 cuBLAS accumulates in    hardware
    float16             float32, float16  float32                  tensor cores
    bfloat16            float32, bfloat16 float32                  tensor cores
    float32             float32           float32 (no TF32)        CUDA cores
    float64             float64           float64                  FP64 units (tensor cores
                                                                   on A100, H100, H200)

Why not cupy.matmul: it writes its result in the inputs' dtype, so 16-bit inputs would give a
16-bit pre-activation (or a cast afterwards: another pass and a temporary), and it cannot add into
its output (gradient accumulation would need a work buffer and an extra pass). GemmEx does both:
it reads 16-bit operands, accumulates in float32 and writes float32 (activations) or rounds once
into 16 bits (gradients, beta = 1 adds to what is there, in float32, before that one rounding).

Row-major arrays in a column-major library. cuBLAS reads a matrix column by column; a row-major
(C-contiguous) array X (R, C) read that way is X^T (C, R), with leading dimension C:

    row-major  X = [x00 x01 x02]      memory  x00 x01 x02 x10 x11 x12
                   [x10 x11 x12]      column-major with ld = 3: [x00 x10]  = X^T
                                                                [x01 x11]
                                                                [x02 x12]

So cuBLAS, given our buffers, sees c^T = op(b)^T op(a)^T: it gets b as its first operand and a as
its second, each transposed exactly when we asked for op(x) = x^T, and computes the (N, M)
column-major matrix that is c in row-major. `cublas_arguments` does this bookkeeping and is tested
on the CPU (tests/reference/test_gemm.py) against a column-major GEMM written out in NumPy.
"""
import numpy as np

# cuBLAS and CUDA enum values (cublas_api.h, library_types.h): stable parts of their ABI
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_POINTER_MODE_HOST = 0
CUDA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}   # cudaDataType_t

# the accumulation type for each input dtype, and alpha/beta in it (read from host memory)
ACCUMULATE = {"float16": CUBLAS_COMPUTE_32F, "bfloat16": CUBLAS_COMPUTE_32F,
               "float32": CUBLAS_COMPUTE_32F, "float64": CUBLAS_COMPUTE_64F}
_SCALARS = {CUBLAS_COMPUTE_32F: (np.ones(1, np.float32), np.zeros(1, np.float32)),
            CUBLAS_COMPUTE_64F: (np.ones(1, np.float64), np.zeros(1, np.float64))}


def cublas_arguments(a, b, c, trans_a=False, trans_b=False):
    """For c = op(a) @ op(b) on row-major arrays: (transa, transb, m, n, k, first, lda, second,
    ldb, ldc), the shape arguments of cublasGemmEx in its order, with the operand arrays."""
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.ndim != 2 or not x.flags.c_contiguous:
            raise ValueError(f"gemm: {name} must be a C-contiguous matrix, not {x.shape} {x.strides}")
    rows, inner = a.shape[::-1] if trans_a else a.shape           # op(a): (M, K)
    inner_b, cols = b.shape[::-1] if trans_b else b.shape         # op(b): (K, N)
    if inner != inner_b or c.shape != (rows, cols):
        raise ValueError(f"gemm: op(a) {(rows, inner)} @ op(b) {(inner_b, cols)} cannot fill c {c.shape}")
    return (CUBLAS_OP_T if trans_b else CUBLAS_OP_N,   # cuBLAS's first operand is our b ...
            CUBLAS_OP_T if trans_a else CUBLAS_OP_N,   # ... and its second our a
            cols, rows, inner,                         # m, n, k of c^T (N, M) = op(b)^T op(a)^T
            b, max(b.shape[1], 1), a, max(a.shape[1], 1), max(c.shape[1], 1))


def gemm(a, b, c, trans_a=False, trans_b=False, accumulate=False):
    """c = op(a) @ op(b), or c += op(a) @ op(b) with accumulate: CuPy arrays on the current GPU,
    queued on CuPy's current stream (cuBLAS is asynchronous, like a kernel)."""
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a is {a.dtype} but b is {b.dtype}")
    transa, transb, m, n, k, first, lda, second, ldb, ldc = cublas_arguments(a, b, c, trans_a, trans_b)
    if c.size == 0:
        return
    compute = ACCUMULATE[a.dtype.name]
    one, zero = _SCALARS[compute]
    handle = device.get_cublas_handle()
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    cublas.gemmEx(handle, transa, transb, m, n, k, one.ctypes.data,
                  first.data.ptr, CUDA_TYPE[first.dtype.name], lda,
                  second.data.ptr, CUDA_TYPE[second.dtype.name], ldb,
                  (one if accumulate else zero).ctypes.data, c.data.ptr, CUDA_TYPE[c.dtype.name], ldc,
                  compute, CUBLAS_GEMM_DEFAULT)
