"""One pass through a device's layer operations on small-integer inputs, for comparing devices.

Used by tests/reference/test_device_ops.py (the GPU device with NumPy stand-ins for cuBLAS and the kernels)
and by tests/gpu_check.py (the real GPU): each runs it on the CPU device and on the other device
with the same inputs and compares the results. Small integers make every product and sum exact,
so the GEMMs' results must agree bitwise whatever their summation order.
"""
import numpy as np

from zerompi.device import to_numpy

B, I, O = 6, 5, 4          # rows, input width, output width


def run_layer_ops(device, precision, seed=3):
    """Forward (linear + GELU, and linear alone), GELU backward, linear backward written then
    accumulated (two micro-batches), and the gradient's sum of squares, on `device`. Returns
    {name: host array} of the outputs, in their dtypes, and the inputs x, dy."""
    storage, compute = precision.storage, precision.compute
    operand = device.operand_dtype(precision)
    work = device.linear_work(lambda kind, name, shape, dtype: device.zeros(shape, dtype), O * I + O, B,
                              precision, 2)
    rng = np.random.default_rng(seed)                  # the same values on every device

    def integers(shape, dtype):
        return device.from_numpy(rng.integers(-4, 5, shape).astype(dtype))
    x, dy, d_out = integers((B, I), operand), integers((B, O), operand), integers((B, O), compute)
    weight, bias = integers((O, I), storage), integers(O, storage)
    pre, y, t = device.zeros((B, O), compute), device.zeros((B, O), operand), device.zeros((B, O), compute)
    device.linear_gelu_forward(x, weight, bias, pre, y, t, work)
    logits = device.zeros((B, O), compute)
    device.linear_forward(x, weight, bias, logits, work)
    d_pre = device.zeros((B, O), operand)
    device.gelu_backward(d_out, pre, t, d_pre)
    dweight, dbias, dx = device.zeros((O, I), storage), device.zeros(O, storage), device.zeros((B, I), compute)
    device.linear_backward(dy, x, weight, dweight, dbias, dx, False, work)
    device.linear_backward(dy, x, weight, dweight, dbias, None, True, work)
    square = device.zeros(1, np.float64)
    device.sum_of_squares(dweight.reshape(-1), square, work)
    device.synchronize()
    return {name: to_numpy(a) for name, a in dict(pre=pre, logits=logits, y=y, d_pre=d_pre, dweight=dweight,
                                                   dbias=dbias, dx=dx, square=square, x=x, dy=dy).items()}
