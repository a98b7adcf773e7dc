"""Which device a rank computes on, chosen once at start, before MPI initializes.

    --device cpu    NumPy (zerompi/cpu.py)
    --device gpu    CuPy, one GPU per rank (zerompi/devices/gpu.py); an error when CuPy is missing
                    or sees no GPU
    --device auto   the GPU when CuPy imports and sees one, else the CPU (the default)

Which GPU: the launcher's local rank modulo the GPUs this process sees, chosen BEFORE MPI
initializes (zerompi/comm.py initializes MPI when the first Communicator is built): a CUDA-aware
MPI may create its CUDA context, or register memory, on the device current at MPI_Init. With more
ranks than GPUs, ranks share them (local ranks 0..3 on one GPU all use GPU 0).

    local-rank variable          set by                        (read in this order)
    OMPI_COMM_WORLD_LOCAL_RANK   Open MPI's mpirun
    MPI_LOCALRANKID              MPICH's hydra mpiexec, Intel MPI
    PALS_LOCAL_RANKID            Cray PALS (aprun's successor)
    PMI_LOCAL_RANK               some PMI launchers
    SLURM_LOCALID                srun

Slurm: `--gpus-per-task` gives each task only its own GPU (CUDA_VISIBLE_DEVICES holds one
device), so every rank sees a "GPU 0" and CUDA IPC between the ranks of a node fails (MPI then
falls back to slow paths, or errors). Request `--gpus-per-node=G --gpu-bind=none` instead and
let the local rank choose (the scripts in slurm/ do).

`check_device` then says what the chosen device cannot do for the run's --dtype and --comm.
"""
import numpy as np

from ...mpi import first_number
from ...cpu import CPU
from ...precision import BF16
from ...devices.gpu import GPU

DEVICE_CHOICES = ("auto", "cpu", "gpu")
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID",
                        "PMI_LOCAL_RANK", "SLURM_LOCALID")


def local_rank(environ):
    """This process's rank among the processes of its node, as the launcher numbered it (0 when unknown)."""
    return first_number(environ, LOCAL_RANK_VARIABLES)


def select_device(choice, environ):
    """(device, error message or None) for --device choice; call before MPI initializes.
    On an error the CPU device is returned, so that the run can report it and exit cleanly."""
    if choice == "cpu":
        return CPU(), None
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:                   # no CuPy, no driver, no device: all mean "no GPU here"
        reason = ("CuPy is not installed (pip install cupy-cuda12x, or cupy-cuda13x for CUDA 13)" if isinstance(e, ImportError)
                  else f"CuPy finds no usable GPU ({type(e).__name__}: {e})".splitlines()[0])
        return CPU(), (f"--device gpu: {reason}" if choice == "gpu" else None)
    if count == 0:
        return CPU(), ("--device gpu: CuPy sees no GPU (check CUDA_VISIBLE_DEVICES)" if choice == "gpu" else None)
    return GPU(cupy, local_rank(environ) % count, count), None


def check_device(device, precision, nccl, ranks_on_node):
    """What the chosen device cannot do for this run (precision: zerompi/precision.py's; nccl:
    whether the training collectives run on NCCL), as a one-line message, or None."""
    if nccl and not device.is_gpu:
        return "--comm nccl needs a GPU, and this run has none (see --device)"
    if nccl and not nccl_available():
        return "--comm nccl: CuPy finds no NCCL library (pip install nvidia-nccl-cu12, or use --comm mpi)"
    if nccl and ranks_on_node > device.count:
        return (f"--comm nccl: {ranks_on_node} ranks on this node but {device.count} GPU(s): NCCL needs a "
                f"GPU per rank (use --comm mpi to share GPUs)")
    if device.is_gpu and precision.storage == BF16:
        try:
            device.zeros(2, BF16).astype(np.float32)     # a kernel on bfloat16, not only a memset
        except Exception:
            return "--dtype bf16: this CuPy has no bfloat16 arrays; on the GPU use fp16 or float32"
    return None


def nccl_available():
    """Whether CuPy finds an NCCL library (False without CuPy)."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    return nccl.available
