"""Fused GPU kernels (CuPy ElementwiseKernels): one pass over memory where NumPy needs several.

On the CPU, zerompi/layers.py and zerompi/adam.py write each formula as a chain of in-place NumPy
passes over cache-sized pieces. On a GPU each pass would be a kernel launch and a full trip through
device memory, so each formula is one kernel here, with the same math (the GPU device calls them,
zerompi/devices/gpu.py):

    add_bias        y += bias (each row)                                reads bias;     updates y
    gelu_forward    y = x/2 (1 + t),  t = tanh(c (x + a x^3))          reads x;        writes y, t
    bias_gelu_forward   x += bias, then gelu_forward                   reads x, bias;  writes x, y, t
    gelu_backward   dx = dy (1 - s/2)(1 + q s),  s = 1 - t,
                    q = c x (1 + 3 a x^2)                              reads dy, x, t; writes dx
    adamw           g' = g * multiplier;  p *= 1 - lr wd;
                    m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
                    p -= step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps)
                    [16-bit params: param = round(p), p being the fp32 master]
                                                     reads g, p, m, v; writes p, m, v [, param]

Kernels are compiled by CuPy on first use (CuPy is imported only then: this module loads on
machines without it). T is the compute dtype (float32/float64), G the gradient's storage dtype,
P the parameters' (16-bit in mixed precision). The outputs Y of gelu_forward and D of
gelu_backward are what the next matrix multiply reads (zerompi/model.py's operands): T, or in mixed precision
16 bits, rounded once as the kernel writes them, so feeding the tensor cores costs no extra pass.
A 16-bit bias (B) and 16-bit gradients (G) are widened as they are read.

The kernels' sources are data (`elementwise_sources`), so that
tests/support/kernel_compile_check.py can compile each with NVRTC for every dtype it meets, on a machine
without a GPU.
"""
_kernels = {}

_ADAMW = """
    T g = (T)g_in * multiplier;
    p = p * decay;
    m = beta1 * m + ((T)1 - beta1) * g;
    v = beta2 * v + ((T)1 - beta2) * g * g;
    p = p - step_size * (m / (sqrt(v) / sqrt_bias2 + eps));
"""
_ADAMW_INPUTS = "G g_in, T multiplier, T decay, T beta1, T beta2, T step_size, T sqrt_bias2, T eps"

def elementwise_sources():
    """{name: (input params, output params, body)} of each cupy.ElementwiseKernel."""
    from ..layers import GELU_A, GELU_C
    gelu = f"""
        t = tanh((T){GELU_C!r} * (x + (T){GELU_A!r} * x * x * x));
        y = (Y)((T)0.5 * x * ((T)1 + t));
    """
    return {
        "add_bias": ("B bias", "T y", "y = y + (T)bias;"),
        "gelu_forward": ("T x", "Y y, T t", gelu),
        "bias_gelu_forward": ("B bias", "T x, Y y, T t", "x = x + (T)bias;" + gelu),
        "gelu_backward": ("T dy, T x, T t", "D dx", f"""
            T s = (T)1 - t;
            T q = (T){GELU_C!r} * x * ((T)1 + (T){3 * GELU_A!r} * x * x);
            dx = (D)(dy * ((T)1 - (T)0.5 * s) * ((T)1 + q * s));
        """),
        "adamw": (_ADAMW_INPUTS, "T p, T m, T v", _ADAMW),
        "adamw_mixed": (_ADAMW_INPUTS, "T p, T m, T v, P param", _ADAMW + "param = (P)p;"),
    }


def _kernel(name):
    """The compiled kernel (CuPy compiles on first call for each dtype combination)."""
    if name not in _kernels:
        import cupy
        _kernels[name] = cupy.ElementwiseKernel(*elementwise_sources()[name], f"zerompi_{name}")
    return _kernels[name]


def add_bias(y, bias):
    _kernel("add_bias")(bias, y)


def gelu_forward(x, y, tanh_u, bias=None):
    if bias is None:
        _kernel("gelu_forward")(x, y, tanh_u)
    else:
        _kernel("bias_gelu_forward")(bias, x, y, tanh_u)


def gelu_backward(dy, x, tanh_u, dx):
    _kernel("gelu_backward")(dy, x, tanh_u, dx)


def adamw(grad, master, m, v, param, multiplier, decay, beta1, beta2, step_size, sqrt_bias2, eps):
    """One AdamW step over whole device arrays in one kernel. master is the compute-dtype copy
    (param itself in full precision); param (16-bit) gets round(master) when it is a separate array."""
    t = master.dtype.type
    scalars = [t(s) for s in (multiplier, decay, beta1, beta2, step_size, sqrt_bias2, eps)]
    if param is master:
        _kernel("adamw")(grad, *scalars, master, m, v)
    else:
        _kernel("adamw_mixed")(grad, *scalars, master, m, v, param)
