"""Launch sanity and per-rank resources, checked before any collective.

A launcher and an MPI library that do not match (srun with the wrong --mpi plugin, or the mpirun
of another MPI than the one mpi4py loaded) start N processes that each initialize MPI alone: N
separate jobs of size 1, each training on its own and each believing it is rank 0. Nothing fails;
the run is just silently wrong. The launcher tells its processes how many they are, in its own
environment variables; if that number differs from what MPI reports, stop and say what to fix.

    variable               set by                                   (checked in this order)
    PMI_SIZE               MPICH's hydra mpiexec, srun --mpi=pmi2, Intel MPI
    OMPI_COMM_WORLD_SIZE   Open MPI's mpirun (prterun)
    PMIX_SIZE              some PMIx launchers
    SLURM_STEP_NUM_TASKS   srun (the tasks of this job step), when none of the above is set

BLAS threads per rank: OMP_NUM_THREADS when the user (or a Slurm script, from --cpus-per-task)
set it (to anything but a positive integer: an error, checked here), else the CPUs this process
may run on (its affinity mask) divided by the ranks on its node, at least 1
(zerompi/cpu.py's blas_threads, which the planner's calibration uses too).
"""

# The innermost launcher first: `mpirun` inside a Slurm allocation starts its proxies with srun, so
# its ranks also inherit the proxy step's SLURM_* variables (one task per node), which then say
# nothing about the ranks. SLURM_* count only when no MPI launcher set its own.
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS")
LAUNCHER_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")   # ranks on this node
MOST_THREADS = 1 << 16           # BLAS threads a rank may ask for (OpenBLAS takes a C int)


def launch_mismatch(mpi_size, environ):
    """One-line error when the launcher started a different number of processes than MPI sees."""
    for name in LAUNCHER_SIZE_VARIABLES:
        value = environ.get(name, "")
        if not (value.isascii() and value.isdigit()):
            continue
        if int(value) != mpi_size:
            return (f"the launcher started {value} processes ({name}={value}) but MPI sees {mpi_size} "
                    f"rank{'s' if mpi_size != 1 else ''}: the launcher and the MPI library mpi4py loaded do "
                    f"not match, so each process runs alone. Use the mpirun of that library (see "
                    f"`python -m mpi4py --mpi-library`), or the matching srun plugin: --mpi=pmi2 for "
                    f"MPICH or Intel MPI, --mpi=pmix for Open MPI (`srun --mpi=list`)")
        return None                      # the innermost launcher agrees
    return None


def threads_variable_error(environ):
    """One-line error if OMP_NUM_THREADS is set but is not a positive integer (OpenMP also allows
    a comma-separated list, one count per nesting level: its first entry counts), else None."""
    value = environ.get("OMP_NUM_THREADS")
    first = (value or "").split(",")[0].strip()
    if value is None or (first.isascii() and first.isdigit() and 0 < int(first) <= MOST_THREADS):
        return None
    return (f"OMP_NUM_THREADS={value!r} is not a positive integer of at most {MOST_THREADS}: set it to the BLAS "
            f"threads per rank, or unset it")
