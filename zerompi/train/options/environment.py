"""The environment variables zerompi reads, and what for: one table, which `--help` prints at its
end (zerompi/train/options/config.py) and tests/proofs/test_cli.py checks against every read in zerompi/.

None of them is needed: the launchers set the rank and size variables, and the rest are overrides.
The names themselves live where they are read; this table only collects them.
"""
from .device_choice import LOCAL_RANK_VARIABLES
from ...devices.mpi_cuda import OVERRIDE as CUDA_AWARE_OVERRIDE
from ..outputs.destination import SLURM_JOB, SLURM_PTY
from ...mpi import LAUNCHER_RANK_VARIABLES
from .launch import LAUNCHER_LOCAL_SIZE_VARIABLES, LAUNCHER_SIZE_VARIABLES
from ..outputs.metrics import SLURM_RESTARTS

# (names, what zerompi does with them), in the order --help lists them
ENVIRONMENT = (
    (("OMP_NUM_THREADS",), "BLAS threads per rank (default: the rank's CPUs / its node's ranks)"),
    (LAUNCHER_SIZE_VARIABLES, "processes the launcher started: must match MPI's rank count"),
    (LAUNCHER_RANK_VARIABLES, "this process's rank before MPI starts (who prints --help)"),
    (LOCAL_RANK_VARIABLES, "rank on its node: which GPU it uses"),
    (LAUNCHER_LOCAL_SIZE_VARIABLES, "--dry-run: ranks per node (default: all on one)"),
    ((CUDA_AWARE_OVERRIDE,), "1 or 0: whether MPI reads GPU memory (default: asked)"),
    ((SLURM_JOB, SLURM_PTY), "a Slurm job (lines), or srun --pty (live): --progress auto; the job: lock"),
    ((SLURM_RESTARTS,), "Slurm's requeue count: in --metrics, TensorBoard and --save-dir's lock"),
)
