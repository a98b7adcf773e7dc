"""Calibration: this machine's limits for the cost model (zerompi/train/commands/cost.py), measured in seconds.

    mpirun -n N python -m zerompi.plan calibrate --out machine.json

Every rank measures at once, as in training (all cores busy), with the BLAS threads a run would
use (zerompi/cpu.py's blas_threads). Each quantity is timed SAMPLES times (a sample: a
barrier, the work, the slowest rank's time) and the best sample is kept: on a shared machine a
single sample can read half the true rate, and noise only ever adds time.

    gemm          the three GEMMs of a linear layer (x W^T, dy^T x, dy W) of GEMM_ROWS rows and
                  width W, for each W in GEMM_WIDTHS: FLOP/s against the FLOPs of one GEMM
                  (GEMM_ROUNDS rounds over the widths, the best of each width kept), cycling
                  through GEMM_WEIGHT_BYTES of weights so that they come from memory, as in a step
    bandwidth     an in-place multiply over 64 MB of float32 (read + write), bytes/s
    elementwise   zerompi/layers.py's bias add, GELU forward and backward and bias sum on a
                  (GEMM_ROWS, 1024) float32 layer output: seconds per element
    adam          zerompi.adam's AdamW.update on ADAM_ELEMENTS elements, per dtype: seconds per element
    overhead      train_step of tiny MLPs (width 8, 2 and 10 layers) on this rank alone: seconds per
                  layer (the difference), and per step (what is left)
    collectives   zerompi.comm.Communicator's all-reduce, reduce-scatter and all-gather of float32
                  buffers of MESSAGE_BYTES, on this rank alone and on all N ranks
    overlap       1 when each rank of this node has a spare core for the communication thread, else 0
    files         with --offload-dir DIR: each rank's scratch file there (zerompi/offload/'s FileTier,
                  FILE_BYTES), written and read a tile at a time as the file tier does: written
                  then synced (fsync) and read after its pages are dropped from the cache
                  (posix_fadvise DONTNEED): the disk's rates; written and read again with the
                  pages in the cache: the page cache's. Bytes/s per rank, all ranks at once

    others_share  the share of the machine's CPU that other processes took meanwhile
                  (zerompi/util/other_processes.py; None where it cannot be read): above
                  --others-limit the calibration is void and no file is written (plan.py)

Written by rank 0 as JSON, atomically (a temporary file, then a rename). Reading one back checks
every field: a file that is not a calibration, truncated or with numbers that cannot be (negative,
not finite, out of order) is a CalibrationError, one line.
"""
import json
import os
import platform
import time

import numpy as np

from ... import layers
from ...adam import AdamConfig, AdamW
from ...offload import TILE, FileTier, OffloadError
from ...util.atomic import atomic_file
from ...comm import Communicator
from ...engine import build_engine
from ...util.inputs import read_whole
from ...util.other_processes import OtherProcesses
from ...ledger import GRADS, MemoryLedger
from ...mpi import MPI
from ...precision import precision_for
from ...step import train_step
from .cost import OPS, FileRates, Machine

FORMAT = "zerompi.plan calibration"
VERSION = 1
SAMPLES = 5
GEMM_ROWS = 64
GEMM_WIDTHS = (256, 512, 1024, 2048, 4096)
GEMM_ROUNDS = 9
GEMM_WEIGHT_BYTES = 32 << 20      # more than the caches hold
ADAM_ELEMENTS = 1 << 21
ADAM_DTYPES = ("float32", "bf16", "fp16", "float64")
MESSAGE_BYTES = tuple(1 << k for k in range(10, 27, 2))        # 1 KiB .. 64 MiB, x4 apart
OVERHEAD_WIDTH, OVERHEAD_LAYERS = 8, (2, 10)
FILE_BYTES = 64 << 20
FILE_RATES = ("read", "write", "cached_read", "cached_write")


class CalibrationError(ValueError):
    """A calibration file that cannot be used: one line."""


def best_seconds(mpi, fn, reps=1, samples=SAMPLES):
    """The best over samples of the slowest rank's time of `reps` calls to fn(), per call."""
    fn()
    best = float("inf")
    for _ in range(samples):
        mpi.Barrier()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, mpi.allreduce((time.perf_counter() - start) / reps, op=MPI.MAX))
    return best


def measure_gemm(mpi):
    """In rounds over the widths, so that a burst of load from elsewhere spoils one round's
    sample of each width, not every sample of one. Each call takes the next of enough weight
    matrices to fill GEMM_WEIGHT_BYTES: in a step every layer's weight comes from memory, not
    from the cache the previous call warmed."""
    rng = np.random.default_rng(0)
    runs = []
    for width in GEMM_WIDTHS:
        x, dy = (rng.standard_normal((GEMM_ROWS, width), dtype=np.float32) for _ in range(2))
        weights = [rng.standard_normal((width, width), dtype=np.float32)
                   for _ in range(max(1, GEMM_WEIGHT_BYTES // (4 * width * width)))]
        out_y, out_dx, out_dw = np.empty_like(x), np.empty_like(x), [np.empty_like(w) for w in weights]
        turn = iter(range(1 << 62))

        def three(x=x, dy=dy, weights=weights, out_y=out_y, out_dx=out_dx, out_dw=out_dw, turn=turn):
            i = next(turn) % len(weights)
            np.matmul(x, weights[i].T, out=out_y)
            np.matmul(dy.T, x, out=out_dw[i])
            np.matmul(dy, weights[i], out=out_dx)
        flops = 2 * GEMM_ROWS * width * width
        runs.append((flops, three, max(len(weights), (1 << 26) // (3 * flops))))
    best = [float("inf")] * len(runs)
    for _ in range(GEMM_ROUNDS):
        for i, (flops, three, reps) in enumerate(runs):
            best[i] = min(best[i], best_seconds(mpi, three, reps=reps, samples=1))
    return [[flops, 3 * flops / seconds] for (flops, _, _), seconds in zip(runs, best)]


def measure_bandwidth(mpi):
    buf = np.ones(16 << 20, np.float32)
    return 2 * buf.nbytes / best_seconds(mpi, lambda: np.multiply(buf, 1.0, out=buf), reps=3)


def measure_elementwise(mpi):
    width = 1024
    rng = np.random.default_rng(1)
    pre, dy = (rng.standard_normal((GEMM_ROWS, width), dtype=np.float32) for _ in range(2))
    bias, dbias = np.zeros(width, np.float32), np.zeros(width, np.float32)
    y, tanh_u, dx = (np.empty_like(pre) for _ in range(3))

    def layer():
        pre.__iadd__(bias)
        layers.gelu_forward(pre, y, tanh_u)
        layers.gelu_backward(dy, pre, tanh_u, dx)
        np.sum(dx, axis=0, out=dbias)
    return best_seconds(mpi, layer, reps=20) / pre.size


def measure_adam(mpi):
    per_element = {}
    for name in ADAM_DTYPES:
        precision = precision_for(name)
        adam = AdamW(ADAM_ELEMENTS, precision, AdamConfig(), MemoryLedger())
        p = np.ones(ADAM_ELEMENTS, precision.storage)
        g = np.full(ADAM_ELEMENTS, 1e-3, precision.storage)

        def update():
            adam.begin_step()
            adam.update(p, g, slice(0, ADAM_ELEMENTS), 1e-3)
        per_element[precision.name] = best_seconds(mpi, update, samples=3) / ADAM_ELEMENTS
    return per_element


def measure_overhead(mpi):
    """Seconds per layer and per step of Python around tiny arithmetic, on this rank alone."""
    comm = Communicator(MPI.COMM_SELF)
    times = []
    for count in OVERHEAD_LAYERS:
        sizes = [OVERHEAD_WIDTH] * (count + 1)
        engine = build_engine(sizes, 0, precision_for("float32"), AdamConfig(), GEMM_ROWS, comm)
        engine.init_params(0)
        x = np.ones((GEMM_ROWS, OVERHEAD_WIDTH), np.float32)
        y = np.zeros(GEMM_ROWS, np.int64)
        times.append(best_seconds(mpi, lambda: train_step(engine, [(x, y)], GEMM_ROWS, 1e-3), reps=20))
    (l0, t0), (l1, t1) = zip(OVERHEAD_LAYERS, times)
    per_layer = max(0.0, (t1 - t0) / (l1 - l0))
    return per_layer, max(0.0, t0 - l0 * per_layer)


def measure_collectives(comm, mpi):
    """op -> [[bytes, seconds], ...] of comm's collectives (the code path training uses)."""
    table = {op: [] for op in OPS}
    for nbytes in MESSAGE_BYTES:
        n = nbytes // 4 // comm.size * comm.size
        full, shard = np.ones(n, np.float32), np.empty(n // comm.size, np.float32)
        calls = {"allreduce": lambda: comm.allreduce_sum(full, GRADS),
                 "reduce_scatter": lambda: comm.reduce_scatter_sum(full, shard, GRADS),
                 "allgather": lambda: comm.allgather(shard, full, GRADS)}
        reps = max(1, (1 << 22) // nbytes)
        for op in OPS:
            table[op].append([full.nbytes, best_seconds(mpi, calls[op], reps=reps)])
    return table


def measure_files(mpi, folder):
    """FILE_RATES -> bytes/s per rank of a scratch file in `folder` (CalibrationError, one line on
    every rank, if any rank cannot make its file or move its bytes)."""
    tile = 3 * TILE * 4                              # master, m, v of one float32 tile
    buf = np.ones(tile, np.uint8)
    failed = []                                      # this rank's first error (its I/O stops there)
    try:
        fd, _ = FileTier(folder, mpi.Get_rank()).create(FILE_BYTES, ".calibration")
    except OffloadError as e:
        failed.append(str(e))
    error = first_error(mpi, failed)
    if error:
        if not failed:
            os.close(fd)
        raise CalibrationError(error)
    offsets = range(0, FILE_BYTES - tile + 1, tile)
    moved = len(offsets) * tile

    def kept(move):                                  # an I/O error is kept, not raised: every rank
        def call(*args):                             # stays in the timing's collectives to the end
            if not failed:
                try:
                    move(*args)
                except OSError as e:
                    failed.append(f"cannot measure the offload folder {folder}: {e.strerror}")
        return call

    @kept
    def write(sync):
        for offset in offsets:
            os.pwrite(fd, buf, offset)
        if sync:
            os.fsync(fd)

    @kept
    def read(cached):
        if not cached:                                 # the pages are clean (written synced): dropped,
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)    # the next reads come from the disk
        for offset in offsets:
            os.preadv(fd, [buf], offset)
    try:
        write(True)
        seconds = {"write": best_seconds(mpi, lambda: write(True), samples=3),
                   "read": best_seconds(mpi, lambda: read(False), samples=3),
                   "cached_write": best_seconds(mpi, lambda: write(False), samples=3),
                   "cached_read": best_seconds(mpi, lambda: read(True), samples=3)}
    finally:
        os.close(fd)
    error = first_error(mpi, failed)
    if error:
        raise CalibrationError(error)
    return {name: moved / seconds[name] for name in FILE_RATES}


def first_error(mpi, failed):
    """A collective: the lowest failing rank's line (None if no rank failed)."""
    return next((e for e in mpi.allgather(failed[0] if failed else None) if e), None)


def calibrate(offload_dir=None):
    """Measure everything above on the ranks of MPI.COMM_WORLD; returns the calibration (a dict).
    offload_dir: the folder whose file rates to measure too (None: no file rates)."""
    from threadpoolctl import threadpool_limits
    from ...cpu import blas_threads
    world = Communicator()
    mpi = world.mpi
    ranks_on_node = world.ranks_on_this_node()
    cores = len(os.sched_getaffinity(0))
    started, others = time.perf_counter(), OtherProcesses(mpi)
    others.start()
    with threadpool_limits(limits=blas_threads(ranks_on_node, os.environ, cores)):
        result = {"format": FORMAT, "version": VERSION, "ranks": world.size,
                  "machine": {"host": platform.node(), "processor": platform.processor(), "cores": cores,
                              "ranks_on_node": ranks_on_node,
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
                  "gemm": measure_gemm(mpi),
                  "bandwidth": measure_bandwidth(mpi),
                  "elementwise_s": measure_elementwise(mpi),
                  "adam_s": measure_adam(mpi)}
        result["layer_overhead_s"], result["step_overhead_s"] = measure_overhead(mpi)
        result["collectives"] = {"1": measure_collectives(Communicator(MPI.COMM_SELF), mpi)}
        if world.size > 1:
            result["collectives"][str(world.size)] = measure_collectives(world, mpi)
        if offload_dir is not None:
            result["files"] = measure_files(mpi, offload_dir)
    result["overlap_efficiency"] = 1.0 if cores >= 2 * ranks_on_node else 0.0
    result["seconds"] = mpi.allreduce(time.perf_counter() - started, op=MPI.MAX)
    result["others_share"] = others.share()
    return result


def write_calibration(result, path):
    """Atomically (zerompi/util/atomic.py: a temporary file beside `path`, then a rename)."""
    with atomic_file(path, "w") as f:
        json.dump(result, f, indent=1)


def read_calibration(path):
    """The Machine a calibration file describes; CalibrationError (one line) if it is not one."""
    try:
        data = json.loads(read_whole(path, _unreadable, "a calibration file"))
    except OSError as e:
        raise CalibrationError(f"cannot read the calibration {path}: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{path} is not a calibration file (not JSON: {e})") from None
    except RecursionError:
        raise CalibrationError(f"{path} is not a calibration file (JSON nested too deeply)") from None
    try:
        return machine_from(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise CalibrationError(f"{path} is not a usable calibration file ({detail}); "
                               f"write one with `python -m zerompi.plan calibrate`") from None


def _unreadable(message):
    """CalibrationError for read_whole's message (which names the file)."""
    return CalibrationError(f"cannot read the calibration {message}")


def _positive(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < float("inf")):
        raise ValueError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def _non_negative(value, what):
    return 0.0 if value == 0 and not isinstance(value, bool) else _positive(value, what)


def _curve(points, what):
    """[[x, y], ...] with x rising and y positive."""
    if not isinstance(points, list) or not points:
        raise ValueError(f"{what} must be a non-empty list of [size, value] pairs")
    curve = tuple((_positive(x, what), _positive(y, what)) for x, y in points)
    if any(a[0] >= b[0] for a, b in zip(curve, curve[1:])):
        raise ValueError(f"{what}: sizes must rise")
    return curve


def machine_from(data):
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"no \"format\": \"{FORMAT}\"")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, this zerompi reads {VERSION}")
    collectives = {}
    for ranks, table in data["collectives"].items():
        if not (ranks.isascii() and ranks.isdigit() and int(ranks) > 0):
            raise ValueError(f"collectives: {ranks!r} is not a rank count")
        collectives[int(ranks)] = {op: _curve(table[op], f"collectives[{ranks}][{op}]") for op in OPS}
    efficiency = _non_negative(data["overlap_efficiency"], "overlap_efficiency")
    if efficiency > 1:
        raise ValueError(f"overlap_efficiency must lie in [0, 1], got {efficiency}")
    return Machine(gemm=_curve(data["gemm"], "gemm"),
                   bandwidth=_positive(data["bandwidth"], "bandwidth"),
                   collectives=collectives,
                   elementwise_s=_positive(data["elementwise_s"], "elementwise_s"),
                   adam_s={name: _positive(s, f"adam_s[{name}]") for name, s in data["adam_s"].items()},
                   layer_overhead_s=_non_negative(data["layer_overhead_s"], "layer_overhead_s"),
                   step_overhead_s=_non_negative(data["step_overhead_s"], "step_overhead_s"),
                   overlap_efficiency=efficiency,
                   files=None if "files" not in data else
                   FileRates(**{name: _positive(data["files"][name], f"files[{name}]") for name in FILE_RATES}))

