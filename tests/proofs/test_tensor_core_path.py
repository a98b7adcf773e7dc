"""The GPU device's arithmetic (zerompi/devices/gpu.py, zerompi/devices/gemm.py) without a GPU.

The stand-in device StandInTensorCores (tests/support/device_stand_in.py) is the GPU device with NumPy
stand-ins for cuBLAS and the fused kernels, so the MLP and Adam compute as on a GPU: 16-bit
operands (x_i, d_pre_i, d_logits) rounded once by the code that writes them, float32 GEMM outputs,
gradients accumulated in float32 inside the GEMM and rounded once into 16 bits, AdamW in the fused
kernel's form. Every GEMM goes through cublas_arguments and a column-major GEMM that does what
cuBLAS does with them. Run under mpirun at N = 1, 2, 3, 4, 8 with real collectives:

- bf16 and fp16, every stage, with and without gradient accumulation: within the mixed tolerance
  of single-process AdamW (tests/proofs/test_zero_equals_single_process_adamw.py's criterion for the CPU's mixed runs);
- it really is the 16-bit path: the operand buffers are 16-bit, no weight is widened, no gradient
  passes through a float32 work buffer (the GEMM adds and rounds; each gradient's sum of squares
  is the GEMM g g^T), and the weights differ from the CPU's widening path (which keeps
  activations in float32);
- float32 and float64 through the GEMMs (as on a GPU in full precision): the CPU's weights, to
  float32's and float64's summation-order tolerance, accumulation (beta = 1) included.
"""
import ml_dtypes
import numpy as np
import pytest

from device_stand_in import StandInTensorCores
from helpers import consolidated, make_batches, train_zero
from helpers import assert_mixed_run_matches_reference, micro_batches_for
from zerompi.devices import communicator_on

SIZES = [12, 37, 53, 7]   # a layer of 481 elements: a padded shard at every N > 1
BF16 = np.dtype(ml_dtypes.bfloat16)


def gemm_comm():
    return communicator_on(StandInTensorCores(), mpi_reads_device_memory=False)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["K1", "K2-3"])
def test_16bit_gemm_path_matches_single_process_adamw(stage, dtype, accumulate):
    from mpi4py import MPI
    k = micro_batches_for(MPI.COMM_WORLD.Get_size()) if accumulate else 1
    batches = make_batches(SIZES, 3)
    engine = assert_mixed_run_matches_reference(stage, SIZES, dtype, batches, k, gemm_comm())
    mlp = engine.mlp
    work = [name for kind, name, *_ in engine.memory.buffers if kind == "work"]
    assert "mlp.param_work" not in work and "mlp.grad_work" not in work   # nothing widened, nothing added outside the GEMM
    assert "mlp.ones" in work and "mlp.square_sum" in work and "adam.scratch" not in work
    assert all(x.dtype == dtype for x in mlp.x) and all(d.dtype == dtype for d in mlp.d_pre)
    assert mlp.d_logits.dtype == dtype and all(p.dtype == np.float32 for p in mlp.pre)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 3])
def test_16bit_gemm_path_is_not_the_widening_path(stage):
    batches = make_batches(SIZES, 3)
    widened, _ = train_zero(stage, SIZES, BF16, batches)
    tensor_cores, _ = train_zero(stage, SIZES, BF16, batches, gemm_comm())
    differ = [not np.array_equal(w, w2) for (w, _), (w2, _) in zip(consolidated(widened), consolidated(tensor_cores))]
    assert any(differ)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 2e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("k", [1, 2])
def test_full_precision_gemm_path_matches_the_cpu(stage, dtype, tolerance, k):
    batches = make_batches(SIZES, 3, rows=48)
    cpu, _ = train_zero(stage, SIZES, dtype, batches, micro_batches=k)
    gpu_like, _ = train_zero(stage, SIZES, dtype, batches, gemm_comm(), micro_batches=k)
    for (w, b), (w2, b2) in zip(consolidated(cpu), consolidated(gpu_like)):
        np.testing.assert_allclose(w2, w, rtol=0, atol=tolerance)
        np.testing.assert_allclose(b2, b, rtol=0, atol=tolerance)
