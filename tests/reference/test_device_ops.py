"""The device's operations (zerompi/cpu.py, zerompi/devices/gpu.py), the CPU's against its NumPy reference
and the GPU's against the CPU's, without a GPU.

The GPU's methods run as they are, with NumPy stand-ins for cuBLAS and the fused kernels
(tests/support/device_stand_in.py: StandInTensorCores). Inputs are small integers, so that every product
and sum is exact in float32: the CPU's widening path and the GPU's 16-bit GEMM path must then agree
bitwise, roundings into 16 bits included, and a transposed operand, a missing bias or a dropped
accumulation is an exact mismatch, not a tolerance question.
"""
import subprocess
import sys

import numpy as np
import pytest

from device_ops import run_layer_ops
from device_stand_in import StandInTensorCores
from zerompi import layers
from zerompi.adam import AdamConfig
from zerompi.cpu import CPU
from zerompi.precision import precision_for

B, I, O, MAX_LAYER = 6, 5, 4, 64


def ledger_alloc(names):
    def alloc(kind, name, shape, dtype):
        names.append((kind, name))
        return np.zeros(shape, dtype)
    return alloc


def integers(rng, shape, dtype):
    return rng.integers(-4, 5, shape).astype(dtype)


@pytest.mark.parametrize("dtype,micro_batches,work", [
    ("float32", 1, []), ("float64", 2, ["mlp.grad_work"]), ("bf16", 1, ["mlp.param_work", "mlp.grad_work"]),
    ("fp16", 2, ["mlp.param_work", "mlp.grad_work"])])
def test_cpu_work_buffers_exist_only_where_their_code_runs(dtype, micro_batches, work):
    names = []
    CPU().linear_work(ledger_alloc(names), MAX_LAYER, B, precision_for(dtype), micro_batches)
    assert names == [("work", name) for name in work]
    names = []
    StandInTensorCores().linear_work(ledger_alloc(names), MAX_LAYER, B, precision_for(dtype), micro_batches)
    assert names == [("work", "mlp.ones"), ("work", "mlp.square_sum")]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cpu_mixed_precision_widens_weights_and_rounds_gradients_once(dtype):
    precision = precision_for(dtype)
    storage, f32 = precision.storage, np.float32
    rng = np.random.default_rng(0)
    cpu = CPU()
    work = cpu.linear_work(ledger_alloc([]), MAX_LAYER, B, precision, 2)
    x, weight, bias = integers(rng, (B, I), f32), integers(rng, (O, I), storage), integers(rng, O, storage)
    pre, y, t = np.empty((B, O), f32), np.empty((B, O), f32), np.empty((B, O), f32)
    cpu.linear_gelu_forward(x, weight, bias, pre, y, t, work)
    np.testing.assert_array_equal(pre, x @ weight.astype(f32).T + bias.astype(f32))
    want_y, want_t = np.empty_like(pre), np.empty_like(pre)
    layers.gelu_forward(pre, want_y, want_t)
    np.testing.assert_array_equal(y, want_y)

    dy = integers(rng, (B, O), f32)
    dweight, dbias, dx = integers(rng, (O, I), storage), integers(rng, O, storage), np.empty((B, I), f32)
    start_w, start_b = dweight.copy(), dbias.copy()
    cpu.linear_backward(dy, x, weight, dweight, dbias, dx, False, work)        # first micro-batch: rounded
    np.testing.assert_array_equal(dweight, (dy.T @ x).astype(storage))
    np.testing.assert_array_equal(dbias, dy.sum(0).astype(storage))
    np.testing.assert_array_equal(dx, dy @ weight.astype(f32))
    dweight[...], dbias[...] = start_w, start_b
    cpu.linear_backward(dy, x, weight, dweight, dbias, None, True, work)       # later ones: added, rounded
    np.testing.assert_array_equal(dweight, (start_w.astype(f32) + dy.T @ x).astype(storage))
    np.testing.assert_array_equal(dbias, (start_b.astype(f32) + dy.sum(0)).astype(storage))

    out = np.zeros(1)
    cpu.sum_of_squares(dweight.reshape(-1), out, work)
    assert out[0] == float(np.sum(dweight.astype(np.float64) ** 2))


def test_cpu_full_precision_writes_in_place_then_adds():
    rng = np.random.default_rng(1)
    cpu = CPU()
    work = cpu.linear_work(ledger_alloc([]), MAX_LAYER, B, precision_for("float64"), 2)
    dy, x, weight = rng.standard_normal((B, O)), rng.standard_normal((B, I)), rng.standard_normal((O, I))
    dweight, dbias = np.full((O, I), np.nan), np.full(O, np.nan)
    cpu.linear_backward(dy, x, weight, dweight, dbias, None, False, work)
    want_w, want_b, _ = np.empty((O, I)), np.empty(O), None
    layers.linear_backward(dy, x, weight, want_w, want_b, None)
    np.testing.assert_array_equal(dweight, want_w)
    np.testing.assert_array_equal(dbias, want_b)
    cpu.linear_backward(dy, x, weight, dweight, dbias, None, True, work)
    np.testing.assert_array_equal(dweight, want_w + want_w)
    np.testing.assert_array_equal(dbias, want_b + want_b)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "float32", "float64"])
def test_gpu_layers_equal_the_cpus_on_exact_inputs(dtype):
    """Forward, backward (written, then accumulated) and the sum of squares, through the GPU's
    GEMMs and kernels (16-bit operands in mixed precision) and the CPU's NumPy."""
    precision = precision_for(dtype)
    storage = precision.storage
    cpu, gpu = (run_layer_ops(device, precision) for device in (CPU(), StandInTensorCores()))
    assert gpu["y"].dtype == gpu["d_pre"].dtype == storage            # the tensor cores' operands
    # products and sums of small integers are exact; the GELUs are the same math on the same
    # values, rounded once into 16 bits on the GPU
    np.testing.assert_array_equal(gpu["y"], cpu["y"].astype(storage))
    np.testing.assert_array_equal(gpu["d_pre"], cpu["d_pre"].astype(storage))
    for name in ("pre", "logits", "dweight", "dbias", "dx", "square"):
        np.testing.assert_array_equal(gpu[name], cpu[name], err_msg=name)
    exact = 2 * (cpu["dy"].astype(np.float64).T @ cpu["x"].astype(np.float64))      # two micro-batches of dy^T x
    np.testing.assert_array_equal(cpu["dweight"], exact.astype(storage))


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_gpu_adamw_is_the_cpus_update(dtype):
    """The fused kernel's form (p - step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps)) against
    adamw_chunked's, over two steps: the same update to float32 rounding, whichever argument the
    GPU device hands to which kernel parameter."""
    precision = precision_for(dtype)
    config = AdamConfig(beta1=0.8, beta2=0.99, eps=1e-3, weight_decay=0.1)
    rng = np.random.default_rng(4)
    start = rng.standard_normal(100).astype(np.float32)
    grads = [(rng.standard_normal(100) * 4).astype(precision.storage) for _ in range(2)]
    results = []
    for device in (CPU(), StandInTensorCores()):
        work = device.adamw_work(100, precision, ledger_alloc([]))
        assert (work is None) == device.is_gpu
        param = start.astype(precision.storage)
        master = start.copy() if precision.mixed else param
        m, v = np.zeros(100, np.float32), np.zeros(100, np.float32)
        for t, grad in enumerate(grads, start=1):
            lr = 0.05
            device.adamw(param, grad.copy(), master, m, v, 0.5, 1 - lr * config.weight_decay,
                         lr / (1 - config.beta1 ** t), np.sqrt(1 - config.beta2 ** t), config, work)
        results.append((param.astype(np.float32), master, m, v))
    for got, want in zip(*results[::-1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results[1][0], results[1][1].astype(precision.storage).astype(np.float32))
    assert not np.allclose(results[0][0], start, atol=1e-3)             # it moved


def test_the_devices_do_not_import_the_program():
    """zerompi/devices/ is below the training program (zerompi/train/), not beside it."""
    code = ("import sys, zerompi.device, zerompi.devices.nccl, zerompi.devices.mpi_cuda\n"
            "print(sorted(m for m in sys.modules if m.startswith('zerompi.train')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
