"""The preflight: before a run allocates anything, does its plan fit in the memory a rank may use?

    need       the plan's buffers (zerompi/plan/__init__.py: what the run's MemoryLedger will
               count, buffer by buffer)
             + what the start of a run allocates beside them for a moment: initial values, a
               chunk of a layer at a time, drawn in float64 and converted to the compute dtype
               (zerompi/model.py init_layer_chunks, zerompi/stages/params.py set_layer_params):
               min(largest layer, INIT_CHUNK) x (8 + compute bytes); a run that starts from
               --init-weights or a checkpoint reads a whole layer at a time instead
               (zerompi/checkpoint/weights.py): the largest layer x 17 bytes, its float64
               values beside one tensor of the file (float64 at most) and its finiteness
               check (1 byte an element), or beside their compute-dtype copy
             + what the libraries allocate once the run has started, beside the engine:
               MPI's scratch: MPICH allocates up to the buffer of a large Allreduce or
               Reduce_scatter_block, and keeps it (or glibc's heap does) per communicator: the
               largest call of the step on each communicator, summed;
               each thread the engine starts (--overlap's communication thread, and with
               --collective-timeout a watchdog for each communicator it makes): its stack
               (ulimit -s) and its malloc arena (64 MB of address space, glibc on 64 bits);
               RUNTIME_RESERVE for the rest (BLAS's buffers, the batches, the report: measured
               7-42 MB beyond the scratch on CPU runs of 2-4 ranks with MPICH 5 and OpenBLAS,
               tests/reference/test_preflight_limits.py); with --fused-adam, NUMBA_BYTES for Numba
               and LLVM once the loop is compiled (measured: 202 MB of address space, 118 MB
               resident, Numba 0.68)
    available  what the device says a rank may still allocate (memory_available): on a CPU the
               least of the address-space limit (ulimit -v) less what the process maps already,
               the memory cgroup's limit less its usage (v2 or v1, its own or an ancestor's) and
               the node's available memory, both shared by the ranks of the node
               (zerompi/util/inputs.py); on a GPU its free memory, shared by the ranks that use it

If need > available, one line says so with both numbers and names what would fit: the other
stages on these N ranks, stage 3 with --offload-optimizer file (the optimizer state in a file,
zerompi/offload/: the tile buffers in memory instead), the same hierarchical variant at other
stages, or else the fewest
ranks on which stage 3 would fit, as many rows per rank:

    stage 0 on 4 ranks needs 3.6 GB per rank, 2.7 GB available (the address-space limit ...):
    stage 1 (2.4 GB), stage 2 (2.0 GB) or stage 3 (1.7 GB) fit on 4 ranks

The run then exits BAD_INPUT (2) before building its engine: no parameter, gradient, optimizer
state or work buffer is allocated. Not counted: the dataset (checked when it is read,
zerompi/train/loop/data.py) and what Python, NumPy, BLAS and MPI map before the preflight (in what
the process maps already).
"""
import resource
from dataclasses import replace

from ..hierarchy import FLAT
from ..offload import FileTier
from ..memory import MOST_RANKS               # how far the search for the fewest ranks that fit goes
from ..model import INIT_CHUNK
from ..util.words import counted, format_bytes
from . import plan_run

RUNTIME_RESERVE = 64 << 20   # bytes the libraries allocate after the start, beside MPI's scratch
THREAD_ARENA = 64 << 20      # glibc's malloc arena for a new thread (HEAP_MAX_SIZE on 64 bits)
NUMBA_BYTES = 256 << 20      # --fused-adam: Numba and LLVM, imported and compiled (zerompi/fused/)
FILE_LAYER_BYTES = 17        # per element while a layer is read from a file: float64 + a tensor + a check


def start_transient_bytes(shape):
    """Bytes the start of a run allocates beside the engine's buffers: one chunk of initial values
    in float64 and in the compute dtype, or one layer read from a file (see the module docstring)."""
    largest = max((n_in + 1) * n_out for n_in, n_out in zip(shape.sizes, shape.sizes[1:]))
    if shape.reads_layers:
        return largest * FILE_LAYER_BYTES
    return min(largest, INIT_CHUNK) * (8 + shape.precision.compute.itemsize)


def runtime_bytes(plan):
    """What the libraries allocate once the run has started (see the module docstring)."""
    scratch = {}
    for call in plan.calls:
        scratch[call.communicator] = max(scratch.get(call.communicator, 0), call.nbytes)
    numba = NUMBA_BYTES if plan.shape.adam_kernel is not None else 0
    return sum(scratch.values()) + plan.threads * thread_bytes() + RUNTIME_RESERVE + numba


def thread_bytes():
    """The address space a new thread takes: its stack (the soft ulimit -s; 8 MiB where it is
    unlimited, glibc's default) and a malloc arena."""
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return (stack if stack != resource.RLIM_INFINITY else 8 << 20) + THREAD_ARENA


def need_bytes(shape, rank=0, device=None):
    """Bytes a rank of this run needs at its peak (see the module docstring)."""
    return need_of(plan_run(shape, rank, device))


def need_of(plan):
    """need_bytes of a plan made already."""
    return plan.total_bytes + start_transient_bytes(plan.shape) + runtime_bytes(plan)


def describe(shape):
    """'stage 2', 'stage 2 in groups of 4', 'stage 3 with hpZ', 'stage 3 with --offload-optimizer file',
    'stage 3 +qwZ +qgZ', 'stage 3 +kept last layer'."""
    offload = f" {shape.offload.describe}" if shape.offload else ""
    offload += f" --offload-params {shape.offload_params.name}" if shape.offload_params else ""
    offload += " +qwZ" if shape.weights_quantizer else ""
    offload += " +qgZ" if shape.grads_quantizer else ""
    offload += " +kept last layer" if shape.keep_last_layer else ""
    if shape.grouping.hybrid(shape.num_ranks):
        return f"stage {shape.stage} in groups of {shape.grouping.shard_group}{offload}"
    return f"stage {shape.stage}{' with hpZ' if shape.grouping.hpz_node_size else ''}{offload}"


def flat_at(shape, stage):
    """The shape at another stage, flat (--offload-params, --quantize-weights and --keep-last-layer
    only where they exist, stage 3; --quantize-grads at stages 2-3)."""
    return replace(shape, stage=stage, grouping=FLAT, offload_params=shape.offload_params if stage == 3 else None,
                   weights_quantizer=shape.weights_quantizer if stage == 3 else None,
                   grads_quantizer=shape.grads_quantizer if stage >= 2 else None,
                   keep_last_layer=shape.keep_last_layer and stage == 3)


def variants(shape):
    """The runs a user could choose instead on the same N ranks: flat stages 0-3, and without
    offload stage 3 with its optimizer state in a file (zerompi/offload/), and the chosen
    hierarchical variant at the stages it exists for."""
    flat = [flat_at(shape, s) for s in range(4)]
    if shape.offload is None:
        flat.append(replace(shape, stage=3, grouping=FLAT, offload=FileTier(None, 0)))
    if shape.grouping.hybrid(shape.num_ranks):
        return flat + [replace(shape, stage=s, keep_last_layer=shape.keep_last_layer and s == 3) for s in (1, 2, 3)]
    if shape.grouping.hpz_node_size:
        return flat + [replace(shape, stage=3)]
    return flat


def fewest_ranks(shape, available, device=None):
    """(N', bytes): the fewest ranks N' > N on which flat stage 3 needs at most `available`
    per rank, as many rows per rank; None if not even MOST_RANKS would do."""
    def need(n):
        return need_bytes(replace(shape, stage=3, grouping=FLAT, num_ranks=n, node_of_rank=None), 0, device)
    low, high = shape.num_ranks, shape.num_ranks * 2
    while need(high) > available:              # stage 3's need falls with N: double, then bisect
        if high >= MOST_RANKS:
            return None
        low, high = high, min(high * 2, MOST_RANKS)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if need(middle) > available else (low, middle)
    return high, need(high)


def preflight_error(shape, rank, device, ranks_on_node):
    """One line if this rank's plan does not fit in what it may allocate (see the module
    docstring), else None."""
    available, limit = device.memory_available(ranks_on_node)
    needed = need_bytes(shape, rank, device)
    if available is None or needed <= available:
        return None
    head = (f"{describe(shape)} on {counted(shape.num_ranks, 'rank')} needs {format_bytes(needed)} per rank, "
            f"{format_bytes(available)} available ({limit})")
    fitting = [(describe(v), need_bytes(v, rank, device)) for v in variants(shape) if v != shape]
    fitting = [(name, nbytes) for name, nbytes in fitting if nbytes <= available]
    if fitting:
        named = [f"{name} ({format_bytes(nbytes)})" for name, nbytes in fitting]
        listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]
        return f"{head}: {listed} {'fits' if len(named) == 1 else 'fit'} on {counted(shape.num_ranks, 'rank')}"
    fewest = fewest_ranks(shape, available, device)
    if fewest is None:
        return f"{head}: no stage fits on up to {MOST_RANKS} ranks (see --dry-run)"
    ranks, nbytes = fewest
    return (f"{head}: no stage fits on {counted(shape.num_ranks, 'rank')}; stage 3 fits on {counted(ranks, 'rank')} "
            f"({format_bytes(nbytes)} each, as many rows per rank)")
