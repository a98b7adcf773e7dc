"""Compile zerompi's GPU kernels with NVRTC, for every dtype combination a run can give them,
without a GPU: `python tests/support/kernel_compile_check.py` where CuPy and NVRTC are installed
(pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12). tests/reference/test_kernel_compile.py
runs it, and skips, saying why, where they are missing.

CuPy compiles an ElementwiseKernel on its first call, for the dtypes of that call's arrays; that
needs a GPU. This check wraps each kernel body (zerompi/devices/kernels.py) the way CuPy does: input
parameters as `const T x = ...`, outputs as references `T &y = ...`, the type placeholders as
typedefs of CuPy's device types (float16, bfloat16: CuPy's own headers), and compiles it for
compute capability 9.0. A body that does not compile for some dtype (a missing conversion from
bfloat16, say) fails here instead of in a user's first GPU run.
"""
import os
import sys

from zerompi.devices import kernels as gpu_kernels
from zerompi.precision import precision_for

C_TYPE = {"float64": "double", "float32": "float", "float16": "float16", "bfloat16": "bfloat16"}


def placeholder_types(dtype_name):
    """{kernel name: {placeholder: C type}} for a --dtype: T is the compute dtype, the 16-bit
    storage dtype is what the GEMMs read (Y, D), the bias (B), the gradients (G) and parameters (P)."""
    precision = precision_for(dtype_name)
    compute, storage = C_TYPE[precision.compute.name], C_TYPE[precision.storage.name]
    kernels = {"add_bias": dict(T=compute, B=storage), "gelu_forward": dict(T=compute, Y=storage),
               "bias_gelu_forward": dict(T=compute, B=storage, Y=storage),
               "gelu_backward": dict(T=compute, D=storage)}
    if precision.mixed:
        kernels["adamw_mixed"] = dict(T=compute, G=storage, P=storage)
    else:
        kernels["adamw"] = dict(T=compute, G=compute)
    return kernels


def declarations(params, output):
    lines = []
    for param in params.split(","):
        type_name, name = param.split()
        lines.append(f"    {type_name} &{name} = _{name}[i];" if output else f"    const {type_name} {name} = _{name}[i];")
    return lines


def kernel_source(name, types):
    """A CUDA source holding the kernel's body as CuPy would wrap it."""
    in_params, out_params, body = gpu_kernels.elementwise_sources()[name]
    arguments = ", ".join(f"{t}* _{n}" for t, n in (p.split() for p in f"{in_params}, {out_params}".split(",")))
    typedefs = "\n".join(f"typedef {c_type} {placeholder};" for placeholder, c_type in types.items())
    return "\n".join(["#include <cupy/carray.cuh>", "#include <cupy/float16.cuh>", "#include <cupy/bfloat16.cuh>",
                      typedefs, f'extern "C" __global__ void zerompi_{name}({arguments}) {{',
                      "    int i = blockIdx.x * blockDim.x + threadIdx.x;",
                      *declarations(in_params, False), *declarations(out_params, True), body, "}"])


def include_folders():
    """CuPy's headers, and the CUDA headers they include (cuda_fp16.h, cuda_bf16.h)."""
    import cupy
    folders = [os.path.join(os.path.dirname(cupy.__file__), "_core", "include")]
    try:
        import nvidia.cuda_runtime
        folders.append(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include"))
    except ImportError:
        pass
    cuda = os.environ.get("CUDA_PATH", "/usr/local/cuda")
    return folders + [os.path.join(cuda, "include")]


def compile_errors(source):
    """NVRTC's log when source does not compile, else None."""
    from cupy_backends.cuda.libs import nvrtc
    program = nvrtc.createProgram(source, "zerompi_kernel.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"-I{f}" for f in include_folders()] + ["--std=c++17", "-arch=compute_90"])
        return None
    except nvrtc.NVRTCError:
        return nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)


def checks():
    """[(label, source)] for every kernel and --dtype."""
    return [(f"{name} for --dtype {dtype_name} ({', '.join(f'{p}={c}' for p, c in types.items())})",
             kernel_source(name, types))
            for dtype_name in ("float64", "float32", "bf16", "fp16")
            for name, types in placeholder_types(dtype_name).items()]


def main():
    from cupy_backends.cuda.libs import nvrtc
    print(f"NVRTC {'.'.join(map(str, nvrtc.getVersion()))}, compute capability 9.0")
    failed = 0
    for label, source in checks():
        log = compile_errors(source)
        print(f"  {'ok    ' if log is None else 'FAILED'} {label}")
        if log is not None:
            failed += 1
            print(source + "\n" + log)
    print("all kernels compile" if not failed else f"{failed} kernel(s) do not compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
