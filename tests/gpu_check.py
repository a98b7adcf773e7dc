"""The GPU check: `python tests/gpu_check.py` on a machine with a GPU (CuPy and mpi4py installed),
about 3 minutes on one GPU; tests/repository/test_gpu_check.py runs it, and skips, saying why, without a GPU.

    1. what is there: the GPU, CuPy, the MPI library, and whether it is CUDA-aware (and how known)
    2. correctness: for ZeRO stages 0-3 and N = 1, 2, 4 ranks sharing the GPU, `python -m
       zerompi.train --device gpu` in float64 must end with the weights of the same run with
       --device cpu (to 1e-10 relative), through the pinned-host staging path
       (ZEROMPI_CUDA_AWARE=0) and, where the MPI is CUDA-aware, through the direct path too;
       float32 (with gradient accumulation too), fp16 and bf16 runs must track the CPU's
       weights; --overlap (collectives from the communication thread) and --comm nccl on one
       rank (NCCL wants a GPU per rank) must match in float64, and so must the optimizer state offloaded
       to pinned host memory and to a file (zerompi/offload/: AdamW on the CPU), with stage 3's
       parameter shard there too, and qwZ's and qgZ's int8 and int4 blocks (CuPy's quantizer against NumPy's); zerompi/devices/gemm.py's cuBLAS GemmEx
       must equal cupy.matmul (float64, every transpose, with and without adding into c) and
       16-bit products must equal float32 products of the same 16-bit values; the GPU device's
       operations (zerompi/devices/gpu.py) must equal the CPU device's on small-integer inputs
       (exact products: bitwise, the GELUs to CUDA's tanh and one 16-bit rounding; AdamW to
       float32 rounding)
    3. the memory preflight (docs/planning.md): the plan of a GPU run (zerompi/plan/ on the GPU
       device) equals its ledger, and a model larger than the GPU's free memory is refused
       before anything is allocated: one line naming the GPU's free memory, exit 2
    4. speed: the benchmark MLP (1024 -> 4 x 2048 -> 10, GELU) on one rank, float32, fp16 and
       bf16: the step's TFLOP/s (6 flops per weight per row: forward 2, backward 4) beside the
       GPU's rate for the GEMM the step runs (zerompi.devices.gemm: 16-bit operands on tensor cores,
       float32 out) at the step's largest shape and at 8192^3, measured in the same run

Exit status 0 when every check passed. The output is plain text, for the README and the notes.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["--data", "synthetic", "--hidden", "96,64", "--batch-size", "96", "--steps", "5",
       "--lr-schedule", "constant", "--report", "none", "--log-every", "0"]
STAGES, RANKS = (0, 1, 2, 3), (1, 2, 4)
TIMEOUT = 120


def mpirun():
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside if os.path.exists(beside) else shutil.which("mpirun") or "mpirun"


def train(n, device, dtype, stage, folder, env=None, extra=()):
    """One zerompi.train run; returns (weights {name: array}, its stdout)."""
    path = os.path.join(folder, f"{device}-{dtype}-s{stage}-n{n}-{len(os.listdir(folder))}.npz")
    command = [mpirun(), "-n", str(n), sys.executable, "-m", "zerompi.train", *RUN, "--device", device,
               "--dtype", dtype, "--stage", str(stage), "--save-weights", path, *extra]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                            env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}")
    with np.load(path) as archive:
        return {k: archive[k].astype(np.float64) for k in archive.files}, result.stdout


def relative_difference(a, b):
    return max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-300)) for k in b)


def correctness(cuda_aware, folder, report):
    ok = True
    paths = [("staged", {"ZEROMPI_CUDA_AWARE": "0"})] + ([("direct", {})] if cuda_aware else [])
    for stage in STAGES:
        for n in RANKS:
            cpu, _ = train(n, "cpu", "float64", stage, folder)
            for name, env in paths:
                gpu, _ = train(n, "gpu", "float64", stage, folder, env)
                diff = relative_difference(gpu, cpu)
                passed = diff <= 1e-10
                ok &= passed
                report(f"  stage {stage}  N={n}  {name:>6}  float64  max rel diff {diff:.1e}  "
                       f"{'ok' if passed else 'FAILED (limit 1e-10)'}")
    for stage in (1, 3):                             # collectives from the communication thread
        cpu, _ = train(2, "cpu", "float64", stage, folder)
        gpu, _ = train(2, "gpu", "float64", stage, folder, {"ZEROMPI_CUDA_AWARE": "0"}, ("--overlap",))
        diff = relative_difference(gpu, cpu)
        ok &= diff <= 1e-10
        report(f"  stage {stage}  N=2  staged  float64 --overlap  max rel diff {diff:.1e}  "
               f"{'ok' if diff <= 1e-10 else 'FAILED (limit 1e-10)'}")
    # float32: summation order only (~1e-7 relative per gradient); 16-bit: the GPU rounds its
    # activations to 16 bits for the tensor cores, the CPU keeps them in float32, so the weights
    # drift apart by ~lr 2^-8 per step on average (the mean limit; a wrong update would be ~lr per
    # step), and an element whose gradient is ~0 may flip its update (the max limit, 2 lr per step).
    steps, lr = 5, 3e-3                              # RUN's steps, zerompi's default --lr
    tracked = [("float32", 3, (), 1e-4, None), ("float32", 2, ("--grad-accum", "2"), 1e-4, None),
               ("fp16", 3, (), 2 * lr * steps, lr * steps / 20), ("bf16", 1, (), 2 * lr * steps, lr * steps / 20),
               ("bf16", 3, ("--grad-accum", "2"), 2 * lr * steps, lr * steps / 20)]
    for dtype, stage, extra, limit, mean_limit in tracked:
        cpu, _ = train(2, "cpu", dtype, stage, folder, extra=extra)
        try:
            gpu, _ = train(2, "gpu", dtype, stage, folder, {"ZEROMPI_CUDA_AWARE": "0"}, extra)
        except RuntimeError as e:
            if "no bfloat16 arrays" not in str(e):
                raise
            report(f"  {dtype}: skipped, this CuPy has no bfloat16 arrays (zerompi says so and exits 2)")
            continue
        # absolute differences (weights are O(0.1)); the mean per tensor, so that a wrong bias
        # update cannot hide among the many more weights
        largest = max(float(np.max(np.abs(gpu[k] - cpu[k]))) for k in cpu)
        worst_mean = max(float(np.mean(np.abs(gpu[k] - cpu[k]))) for k in cpu)
        passed = largest <= limit and (mean_limit is None or worst_mean <= mean_limit)
        ok &= passed
        limits = f"limits max {limit:g}" + ("" if mean_limit is None else f", mean {mean_limit:g}")
        report(f"  stage {stage}  N=2  staged  {dtype:>7} {' '.join(extra)}  max abs diff {largest:.1e}  "
               f"worst tensor mean {worst_mean:.1e}  {'ok' if passed else f'FAILED ({limits})'}")
    scratch = os.path.join(folder, "offload")           # zerompi/offload/: the CPU's AdamW beside the GPU's
    os.makedirs(scratch, exist_ok=True)
    cpu, _ = train(2, "cpu", "float64", 3, folder)
    for optimizer, params in (("host", "none"), ("file", "none"), ("host", "host"), ("file", "file")):
        gpu, _ = train(2, "gpu", "float64", 3, folder, {"ZEROMPI_CUDA_AWARE": "0"},
                       ("--offload-optimizer", optimizer, "--offload-params", params,
                        *(("--offload-dir", scratch) if "file" in (optimizer, params) else ())))
        diff = relative_difference(gpu, cpu)
        ok &= diff <= 1e-10
        report(f"  stage 3  N=2  staged  float64 --offload-optimizer {optimizer} --offload-params {params}  "
               f"max rel diff {diff:.1e}  {'ok' if diff <= 1e-10 else 'FAILED (limit 1e-10)'}")
    for grads in ("int8", "int4"):             # zerompi/quantize/
        qwz = ("--quantize-weights", "int8", "--quantize-grads", grads, "--quant-block", "256")
        cpu, _ = train(2, "cpu", "float64", 3, folder, extra=qwz)
        gpu, _ = train(2, "gpu", "float64", 3, folder, {"ZEROMPI_CUDA_AWARE": "0"}, qwz)
        diff = relative_difference(gpu, cpu)
        ok &= diff <= 1e-10
        report(f"  stage 3  N=2  staged  float64 {' '.join(qwz)}  max rel diff {diff:.1e}  "
               f"{'ok' if diff <= 1e-10 else 'FAILED (limit 1e-10)'}")
    if nccl_available():
        cpu, _ = train(1, "cpu", "float64", 3, folder)
        gpu, _ = train(1, "gpu", "float64", 3, folder, extra=("--comm", "nccl"))
        diff = relative_difference(gpu, cpu)
        ok &= diff <= 1e-10
        report(f"  stage 3  N=1  nccl    float64  max rel diff {diff:.1e}  {'ok' if diff <= 1e-10 else 'FAILED'}")
    else:
        report("  --comm nccl: skipped, CuPy finds no NCCL")
    return ok


def preflight_on_gpu(device, report):
    """docs 3.: the plan against a GPU run's --report json, and a refusal."""
    import json
    from zerompi.ledger import MEMORY_KINDS
    from zerompi.plan import RunShape, plan_memory
    from zerompi.precision import precision_for
    ok = True
    base = [mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", *RUN, "--device", "gpu"]
    for dtype, stage in (("float32", 0), ("bf16", 3)):
        run = subprocess.run(base + ["--dtype", dtype, "--stage", str(stage), "--report", "json"],
                             capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, ZEROMPI_CUDA_AWARE="0"))
        if run.returncode != 0:
            report(f"  preflight: the run failed ({run.returncode}): {run.stderr.strip()[-300:]}")
            ok = False
            continue
        measured = json.loads(run.stdout)["per_rank"][0]
        plan = plan_memory(RunShape((32, 96, 64, 10), stage, precision_for(dtype), 48, 2), 0, device).bytes_by_kind
        # the plan leaves out pinned host staging (host memory): the run's work may hold more
        same = all(plan[k] == measured[k] for k in MEMORY_KINDS if k != "work") and plan["work"] <= measured["work"]
        ok &= same
        report(f"  preflight: stage {stage} {dtype:>7} N=2: plan {plan} / ledger "
               f"{ {k: measured[k] for k in MEMORY_KINDS} }  {'ok' if same else 'FAILED'}")
    huge = subprocess.run(base + ["--hidden", "100000,100000,100000", "--stage", "0", "--steps", "1"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    lines = [line for line in huge.stderr.splitlines() if line.startswith("zerompi: error:")]
    refused = huge.returncode == 2 and len(lines) == 1 and "the free memory of gpu" in lines[0]
    ok &= refused
    report(f"  preflight: 20 G parameters refused: {lines[0] if lines else huge.stderr.strip()[-300:]}  "
           f"{'ok' if refused else 'FAILED'}")
    return ok


def gemm_correctness(cupy, report):
    """zerompi.devices.gemm.gemm on the GPU against cupy.matmul, and 16-bit against float32 products."""
    from zerompi.devices.gemm import gemm
    from zerompi.precision import BF16
    rng = np.random.default_rng(0)
    worst = 0.0
    for trans_a in (False, True):
        for trans_b in (False, True):
            a = cupy.asarray(rng.standard_normal((37, 13) if trans_a else (13, 37)))
            b = cupy.asarray(rng.standard_normal((29, 37) if trans_b else (37, 29)))
            start = cupy.asarray(rng.standard_normal((13, 29)))
            want = cupy.matmul(a.T if trans_a else a, b.T if trans_b else b)
            c = start.copy()
            gemm(a, b, c, trans_a, trans_b)
            added = start.copy()
            gemm(a, b, added, trans_a, trans_b, accumulate=True)
            worst = max(worst, float(cupy.max(cupy.abs(c - want))), float(cupy.max(cupy.abs(added - start - want))))
    ok = worst <= 1e-12
    report(f"  gemm float64, 4 transposes, = and +=: max abs diff from cupy.matmul {worst:.1e}  "
           f"{'ok' if ok else 'FAILED (limit 1e-12)'}")
    for dtype in (np.dtype(np.float16), BF16):
        try:
            a16 = cupy.asarray(rng.standard_normal((64, 256)).astype(dtype))
            b16 = cupy.asarray(rng.standard_normal((128, 256)).astype(dtype))
        except Exception as e:
            report(f"  gemm {dtype.name}: skipped, CuPy cannot hold it ({type(e).__name__})")
            continue
        want = cupy.asarray(cupy.asnumpy(a16).astype(np.float32) @ cupy.asnumpy(b16).astype(np.float32).T)
        out = cupy.zeros((64, 128), np.float32)
        gemm(a16, b16, out, trans_b=True)
        diff = float(cupy.max(cupy.abs(out - want)) / cupy.max(cupy.abs(want)))
        ok &= diff <= 1e-5
        report(f"  gemm {dtype.name} in, float32 out: max rel diff from float32 products {diff:.1e}  "
               f"{'ok' if diff <= 1e-5 else 'FAILED (limit 1e-5)'}")
        # the gradient GEMMs: dW += dy^T x rounded once into 16 bits, db = 1^T dy, |g|^2 = g g^T
        dy, x = (rng.standard_normal((48, n)).astype(dtype) for n in (32, 24))
        start = rng.standard_normal((32, 24)).astype(dtype)
        dweight = cupy.asarray(start)
        gemm(cupy.asarray(dy), cupy.asarray(x), dweight, trans_a=True, accumulate=True)
        want = (start.astype(np.float32) + dy.astype(np.float32).T @ x.astype(np.float32)).astype(dtype)
        ulps = float(np.max(np.abs(cupy.asnumpy(dweight).astype(np.float32) - want.astype(np.float32))   # ulps of
                            / np.maximum(np.abs(want.astype(np.float32)), 1.0))) / float(ml_dtypes.finfo(dtype).eps)  # max(|w|, 1)
        dbias = cupy.zeros((1, 24), dtype)
        gemm(cupy.ones((1, 48), dtype), cupy.asarray(x), dbias)
        bias_diff = float(np.max(np.abs(cupy.asnumpy(dbias)[0].astype(np.float32) - x.astype(np.float32).sum(0))))
        square = cupy.zeros((1, 1), np.float32)
        flat = cupy.asarray(x.reshape(-1))
        gemm(flat[None, :], flat[None, :], square, trans_b=True)
        want_square = float(np.dot(x.astype(np.float32).ravel(), x.astype(np.float32).ravel()))
        square_diff = abs(float(square[0, 0]) - want_square) / want_square
        passed = ulps <= 1.0 and bias_diff <= 0.25 and square_diff <= 1e-5
        ok &= passed
        report(f"  gemm {dtype.name} dW += dy^T x: {ulps:.2f} ulp from rounding once; db = 1^T dy: max abs "
               f"diff {bias_diff:.1e}; g g^T: rel diff {square_diff:.1e}  "
               f"{'ok' if passed else 'FAILED (limits 1 ulp, 0.25, 1e-5)'}")
    return ok


def device_ops_correctness(device, report):
    """zerompi/devices/gpu.py's operations against the CPU device's (zerompi/cpu.py) on the
    same inputs: small integers, so that every product and sum is exact and the GEMMs' results
    must be equal bitwise whatever their summation order (tests/reference/test_device_ops.py runs the same
    comparison with NumPy stand-ins for cuBLAS and the kernels). The GELUs compute tanh with CUDA's
    tanh, not NumPy's: equal to a few float32 ulps, then one 16-bit rounding in mixed precision."""
    from zerompi.adam import AdamConfig
    from zerompi.cpu import CPU
    from zerompi.train.options.device_choice import check_device
    from zerompi.device import to_numpy
    from zerompi.precision import precision_for
    sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
    from device_ops import run_layer_ops
    ok = True
    for dtype_name in ("float64", "float32", "fp16", "bf16"):
        if check_device(device, precision_for(dtype_name), False, 1):
            report(f"  device ops {dtype_name}: skipped, {check_device(device, precision_for(dtype_name), False, 1)}")
            continue
        precision = precision_for(dtype_name)
        storage, compute = precision.storage, precision.compute
        results = []
        for dev in (CPU(), device):
            result = {name: a.astype(np.float64) for name, a in run_layer_ops(dev, precision).items()}
            # AdamW: two steps of the update (16-bit params rounded from the master in mixed precision)
            master = dev.from_numpy(np.linspace(-1, 1, 40).astype(compute))
            param = master if not precision.mixed else dev.from_numpy(to_numpy(master).astype(storage))
            m, v = dev.zeros(40, compute), dev.zeros(40, compute)
            config = AdamConfig(beta1=0.8, beta2=0.99, eps=1e-3, weight_decay=0.1)
            adam_work = dev.adamw_work(40, precision, lambda kind, name, shape, dtype: dev.zeros(shape, dtype))
            for step in (1, 2):
                grad = dev.from_numpy(np.linspace(-3, 2, 40).astype(storage) * step)
                dev.adamw(param, grad, master, m, v, 0.5, 1 - 0.05 * config.weight_decay,
                          0.05 / (1 - config.beta1 ** step), np.sqrt(1 - config.beta2 ** step), config, adam_work)
            dev.synchronize()
            result.update({name: to_numpy(a).astype(np.float64) for name, a in dict(
                master=master, m=m, v=v, param=param).items()})
            results.append(result)
        cpu, gpu = results
        exact = [name for name in ("pre", "logits", "dweight", "dbias", "dx", "square")
                 if not np.array_equal(gpu[name], cpu[name])]
        ulp = 2.0 ** -(8 if storage == precision_for("bf16").storage else 11) if precision.mixed else 0.0
        close = [name for name, rtol, atol in (("y", max(ulp, 1e-5), 1e-4), ("d_pre", max(ulp, 1e-5), 1e-4),
                                               ("master", 1e-5, 1e-6), ("m", 1e-5, 1e-6), ("v", 1e-5, 1e-6),
                                               ("param", max(ulp, 1e-5), 1e-6))
                 if not np.allclose(gpu[name], cpu[name], rtol=rtol, atol=atol)]
        passed = not exact and not close
        ok &= passed
        report(f"  device ops {dtype_name}: GEMM results bitwise equal to the CPU's: "
               f"{'yes' if not exact else 'NO ' + ', '.join(exact)}; GELUs and AdamW within rounding: "
               f"{'yes' if not close else 'NO ' + ', '.join(close)}  {'ok' if passed else 'FAILED'}")
    return ok


def nccl_available():
    from zerompi.train.options.device_choice import nccl_available
    return nccl_available()


def transport():
    """The CUDA-awareness verdict as a run under mpirun sees it (not this process: it starts no
    MPI before the runs above, which mpirun launches)."""
    code = ("import os; from zerompi.train.options.device_choice import select_device; from zerompi.devices import communicator_on; "
            "print(communicator_on(select_device('gpu', os.environ)[0]).describe_transport())")
    result = subprocess.run([mpirun(), "-n", "1", sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=TIMEOUT)
    return result.stdout.strip() or f"unknown ({result.stderr.strip()[-300:]})"


def gemm_tflops(cupy, m, k, n, dtype, repeats=10):
    """Median TFLOP/s of zerompi.devices.gemm's (m, k) @ (k, n) product with dtype operands and a float32
    (float64 for float64) output, as the training step runs it; timed with CUDA events."""
    from zerompi.devices.gemm import gemm
    a = cupy.random.standard_normal((m, k), dtype=np.float32).astype(dtype)
    b = cupy.random.standard_normal((k, n), dtype=np.float32).astype(dtype)
    out = cupy.empty((m, n), np.float64 if np.dtype(dtype).itemsize == 8 else np.float32)
    gemm(a, b, out)
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        gemm(a, b, out)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * m * k * n / np.median(times) / 1e12


def step_speed(device, dtype_name, rows, report):
    """TFLOP/s of the training step of the benchmark MLP on one rank (an engine built in-process)."""
    from zerompi.adam import AdamConfig
    from zerompi.devices import communicator_on
    from zerompi.engine import build_engine
    from zerompi.precision import precision_for
    from zerompi.step import train_step

    sizes = [1024, 2048, 2048, 2048, 2048, 10]
    precision = precision_for(dtype_name)
    engine = build_engine(sizes, 1, precision, AdamConfig(), rows, communicator_on(device))
    engine.init_params(0)
    rng = np.random.default_rng(0)
    x = device.from_numpy(rng.standard_normal((rows, sizes[0])).astype(precision.compute))
    labels = device.from_numpy(rng.integers(0, sizes[-1], rows))
    times = []
    for i in range(13):
        device.synchronize()
        start = time.perf_counter()
        train_step(engine, [(x, labels)], rows, 1e-3)
        device.synchronize()
        if i >= 3:                                     # the first steps compile the kernels
            times.append(time.perf_counter() - start)
    weights = sum(u.in_features * u.out_features for u in engine.layout.layers)
    tflops = 6 * weights * rows / np.median(times) / 1e12
    report(f"  step {dtype_name:>7}  {rows} rows: {np.median(times) * 1e3:7.2f} ms  {tflops:6.1f} TFLOP/s")
    return tflops


def main():
    lines = []

    def report(line):
        print(line, flush=True)
        lines.append(line)

    from zerompi.train.options.device_choice import check_device, select_device
    device, error = select_device("gpu", os.environ)
    if error:
        report(f"SKIPPED: {error}")
        return 0
    from zerompi.comm import MPI                      # imported without starting MPI
    cupy = device.xp
    report(f"GPU check, {time.strftime('%Y-%m-%d')}: {device.name}, CuPy {cupy.__version__}, "
           f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
    line = transport()
    report(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()} | {line}")
    report("correctness, GPU against CPU (python -m zerompi.train, 5 steps, MLP 32-96-64-10):")
    with tempfile.TemporaryDirectory() as folder:
        ok = correctness("CUDA-aware: yes" in line, folder, report)
    ok = gemm_correctness(cupy, report) and ok
    ok = preflight_on_gpu(device, report) and ok
    ok = device_ops_correctness(device, report) and ok
    report("speed, MLP 1024-4x2048-10, one rank, stage 1:")
    rows = 4096
    from zerompi.precision import precision_for
    for dtype_name in ("float32", "fp16", "bf16"):
        operand = precision_for(dtype_name).storage              # what the step's GEMMs read
        cannot = check_device(device, precision_for(dtype_name), False, 1)
        if cannot:
            report(f"  step {dtype_name:>7}: skipped, {cannot}")
            continue
        step = step_speed(device, dtype_name, rows, report)
        same_shape = gemm_tflops(cupy, rows, 2048, 2048, operand)
        big = gemm_tflops(cupy, 8192, 8192, 8192, operand)
        report(f"    GEMM {operand.name} {rows}x2048x2048: {same_shape:6.1f} TFLOP/s (step / GEMM = "
               f"{step / same_shape:.2f});  GEMM {operand.name} 8192^3: {big:6.1f} TFLOP/s")
    report("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
